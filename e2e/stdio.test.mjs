// End-to-end over stdio: the SDK's StdioClientTransport starts `vmgate
// serve --config … --grant local` as its child.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import {
  env, missingEnv, TAGS, vmgate, auditRecords, checkToolList, checkListVMs, checkExec,
  checkKillRateLimit, checkApproval, checkBadInputs, connectStdio, scaled,
} from './lib.mjs';

const connect = () => connectStdio('local', 'vmgate-e2e');

// rawSession runs `vmgate serve` and exchanges raw JSON-RPC lines with it,
// for what the SDK cannot send (duplicate keys).
async function rawSession(lines) {
  const child = spawn(env.bin, ['serve', '--config', env.config, '--grant', 'local'], {
    stdio: ['pipe', 'pipe', 'inherit'], env: { ...process.env, VMGATE_LOG_LEVEL: 'warn' },
  });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  const rl = createInterface({ input: child.stdout });
  const replies = new Map();
  const want = new Set(lines.filter((l) => l.id !== undefined).map((l) => l.id));
  const done = new Promise((resolve) => {
    rl.on('line', (line) => {
      const msg = JSON.parse(line);
      replies.set(msg.id, msg);
      if ([...want].every((id) => replies.has(id))) resolve();
    });
  });
  for (const l of lines) child.stdin.write(l.raw + '\n');
  let timer;
  const timeout = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`no replies within ${scaled(60_000) / 1000} s`)), scaled(60_000)); });
  try {
    await Promise.race([done, timeout]);
  } finally {
    clearTimeout(timer);
  }
  child.stdin.end();
  assert.equal(await exited, 0, 'vmgate serve exit code after stdin closed');
  return replies;
}

test('vmgate over stdio with the MCP SDK', { skip: missingEnv }, async (t) => {
  const client = await connect();
  try {
    assert.equal(client.getServerVersion().name, 'vmgate');
    await t.test('tools/list: names, schemas, annotations', () => checkToolList(client));
    await t.test('list_vms', () => checkListVMs(client));
    await t.test('vm_agent_exec: echo, stdin, timeout', () => checkExec(client));
    await t.test('kill_process: pid 1 refused, 11th kill rate limited', () => checkKillRateLimit(client));
    await t.test('approvals through vmgate approvals', () => checkApproval(client, 'local'));
    await t.test('bad input refused with its tag', () => checkBadInputs(client));
  } finally {
    await client.close();
  }

  await t.test('raw lines: duplicate and case-variant keys', async () => {
    const init = { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } };
    const replies = await rawSession([
      { id: 0, raw: JSON.stringify(init) },
      { raw: '{"jsonrpc":"2.0","method":"notifications/initialized"}' },
      { id: 1, raw: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"kill_process","arguments":{"vm":"${env.vm}","pid":${env.sentinelPID},"pid":1}}}` },
      { id: 2, raw: `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"kill_process","name":"list_vms","arguments":{}}}` },
      { id: 3, raw: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"kill_process","arguments":{"vm":"${env.vm}","pid":${env.sentinelPID},"Signal":"KILL"}}}` },
      { id: 4, raw: `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"list_vms","arguments":{}}}` },
    ]);
    for (const id of [1, 2, 3]) {
      const r = replies.get(id);
      assert.equal(r.result?.isError, true, `raw call ${id}: ${JSON.stringify(r)}`);
      assert.ok(r.result.content[0].text.startsWith(TAGS.invalid + ' '), `raw call ${id}: ${r.result.content[0].text}`);
    }
    assert.equal(replies.get(4).result?.isError, undefined, 'a well-formed call on the same connection works');
  });

  await t.test('the audit log records the refusals and verifies', async () => {
    const recs = await auditRecords();
    const refused = recs.filter((r) => r.grant === 'local' && r.decision === 'invalid');
    assert.ok(refused.some((r) => r.tool === 'rm_everything'), 'unknown tool audited');
    assert.ok(refused.some((r) => r.tool === 'kill_process' && /malformed|duplicate/.test(r.reason)), 'duplicate keys audited');
    assert.ok(recs.some((r) => r.grant === 'local' && r.decision === 'unknown_vm' && r.vm === env.otherVM), "another grant's VM audited");
    assert.ok(recs.some((r) => r.transport === 'operator' && r.decision === 'approval_granted'), 'grants audited');
    assert.ok(recs.some((r) => r.grant === 'local' && r.decision === 'rate_limited'), 'rate limit audited');
    const out = await vmgate('audit', 'verify', '--strict', `${env.state}/audit.log`);
    assert.match(out, /^ok: /);
  });
});
