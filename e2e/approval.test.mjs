// End-to-end: an operator approves a command that reads a script from
// stdin, and sees that script. The Go test starts `vmgate serve --http`
// with grant "gated" (every vm_agent_exec needs an operator) and an
// operator token, plants a victim file in the guest, and afterwards checks
// the guest: the approved script ran once, the swapped one never did.
// The agent's own client (the official SDK, at logging level notice) is
// told that its call waits for an operator and then that it was granted,
// its stdin only as a digest and the env value not at all.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, missingEnv, TAGS, text, call, assertTag, vmgate, auditRecords } from './lib.mjs';

const gated = {
  token: process.env.VMGATE_E2E_GATED_TOKEN,
  operator: process.env.VMGATE_E2E_OPERATOR_TOKEN,
  approvedFile: process.env.VMGATE_E2E_APPROVED_FILE,
  victimFile: process.env.VMGATE_E2E_VICTIM_FILE,
  mark: process.env.VMGATE_E2E_MARK,
};
const skip = missingEnv || (!env.url || !gated.token || !gated.operator ? 'VMGATE_E2E_URL and the gated grant are set by `go test ./e2e`' : false);

// uiPending signs in to /ui with the operator token and returns the
// pending approvals fragment and the page of one approval.
async function uiPages(id) {
  const base = new URL(env.url).origin;
  const jar = new Map();
  const cookies = () => [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
  const keep = (res) => {
    for (const c of res.headers.getSetCookie()) {
      const [kv] = c.split(';');
      const i = kv.indexOf('=');
      jar.set(kv.slice(0, i), kv.slice(i + 1));
    }
  };
  let res = await fetch(`${base}/ui/login`, { headers: { Cookie: cookies() } });
  keep(res);
  const csrf = /name="csrf" value="([^"]+)"/.exec(await res.text())[1];
  res = await fetch(`${base}/ui/login`, {
    method: 'POST', redirect: 'manual',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded', Cookie: cookies() },
    body: new URLSearchParams({ csrf, token: gated.operator }),
  });
  assert.equal(res.status, 303, 'operator login');
  keep(res);
  const pending = await (await fetch(`${base}/ui/pending`, { headers: { Cookie: cookies() } })).text();
  const detail = await (await fetch(`${base}/ui/approval?id=${id}`, { headers: { Cookie: cookies() } })).text();
  return { pending, detail };
}

const unescape = (s) => s.replaceAll('&#39;', "'").replaceAll('&#34;', '"').replaceAll('&gt;', '>').replaceAll('&lt;', '<').replaceAll('&amp;', '&');

test('an operator approval shows the stdin it will run', { skip }, async () => {
  const client = new Client({ name: 'vmgate-e2e-approval', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(env.url), {
    requestInit: { headers: { Authorization: `Bearer ${gated.token}` } },
  }));
  // What the server logs to this session (MCP logging), as the SDK hands
  // it over; waitLog waits for the first that matches.
  const logs = [];
  let logged = () => {};
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { logs.push(n.params); logged(); });
  const waitLog = async (pred, what) => {
    const deadline = Date.now() + 20000;
    for (;;) {
      const found = logs.find(pred);
      if (found) return found;
      assert.ok(Date.now() < deadline, `no log notification ${what} within 20 s; got ${JSON.stringify(logs)}`);
      await new Promise((resolve) => { logged = resolve; setTimeout(resolve, 500); });
    }
  };
  try {
    await client.setLoggingLevel('notice');
    const writeLine = `printf '%s\\n' "$MARK" > ${gated.approvedFile}`;
    const script = `echo innocent\n${writeLine}\n`;
    const args = { vm: env.vm, command: ['sh'], stdin: script, env: { MARK: gated.mark } };
    let res = await call(client, 'vm_agent_exec', args);
    assertTag(res, TAGS.approval, 'the command before approval');
    const id = res.structuredContent.approval_id;
    const parked = await waitLog((l) => l.data.event === 'approval_pending' && l.data.approval_id === id, 'approval_pending');
    assert.equal(parked.level, 'notice');
    assert.equal(parked.logger, 'vmgate');
    assert.deepEqual(parked.data.arguments.command, ['sh'], 'the parked call is shown');
    assert.match(parked.data.arguments.stdin, /^sha256:[0-9a-f]{64},len:\d+$/, 'its stdin only as a digest');

    // What the operator reads: every line of the script, and the env value.
    const list = await vmgate('approvals', 'list', '--config', env.config);
    for (const want of [`${id}  pending  grant gated  tool vm_agent_exec`, '      | echo innocent\n', `      | ${writeLine}\n`,
      `env.MARK (text, ${gated.mark.length} bytes): ${gated.mark}`]) {
      assert.ok(list.includes(want), `vmgate approvals list lacks ${JSON.stringify(want)}:\n${list}`);
    }
    const show = await vmgate('approvals', 'show', id, '--config', env.config);
    assert.ok(show.includes(`      | ${writeLine}\n`), `vmgate approvals show lacks the script:\n${show}`);
    const json = JSON.parse(await vmgate('approvals', 'show', id, '--json', '--config', env.config));
    assert.equal(json.arguments.find((f) => f.name === 'stdin').value, script, 'show --json: stdin as the command gets it');
    const { pending, detail } = await uiPages(id);
    for (const page of [pending, detail]) {
      assert.ok(unescape(page).includes(writeLine) && page.includes(gated.mark), `/ui lacks the script or the env value:\n${page.slice(0, 3000)}`);
    }

    await vmgate('approvals', 'grant', id, '--reason', 'e2e: read the script', '--config', env.config);

    const granted = await waitLog((l) => l.data.event === 'approval_granted' && l.data.approval_id === id, 'approval_granted');
    assert.equal(granted.level, 'notice');

    // The agent swaps the script after the approval: it parks anew.
    res = await call(client, 'vm_agent_exec', { ...args, stdin: `echo innocent\nrm -f ${gated.victimFile}\n` });
    assertTag(res, TAGS.approval, 'a retry with another stdin');
    assert.notEqual(res.structuredContent.approval_id, id);

    // The call the operator saw runs, once.
    res = await call(client, 'vm_agent_exec', args);
    assert.equal(res.isError ?? false, false, `the approved command = ${text(res)}`);
    assert.equal(res.structuredContent.stdout, 'innocent\n');
    assert.equal(res.structuredContent.exit_code, 0);
    res = await call(client, 'vm_agent_exec', args);
    assertTag(res, TAGS.approval, 'the approved command a second time');

    // The audit log kept redacting: the script and the mark are not in it.
    const recs = await auditRecords();
    const mine = recs.filter((r) => r.approval_id === id);
    assert.ok(mine.length >= 2, 'the approval is audited');
    assert.ok(!JSON.stringify(recs).includes(gated.mark), 'the env value is redacted in the audit log');
    assert.ok(!JSON.stringify(recs).includes('echo innocent'), 'stdin is redacted in the audit log');
    // And no log notification carried the script or the env value.
    assert.ok(!JSON.stringify(logs).includes(gated.mark), 'no log notification carries the env value');
    assert.ok(!JSON.stringify(logs).includes('echo innocent'), 'no log notification carries stdin');
  } finally {
    await client.close();
  }
});
