// End-to-end over streamable HTTP: the Go test starts `vmgate serve --http`
// and passes its URL and the bearer token of grant "agent".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  env, missingEnv, TAGS, vmgate, auditRecords, checkToolList, checkListVMs, checkExec,
  checkKillRateLimit, checkApproval, checkBadInputs, scaled,
} from './lib.mjs';

const skip = missingEnv || (!env.url || !env.token ? 'VMGATE_E2E_URL and VMGATE_E2E_TOKEN are set by `go test ./e2e`' : false);

function transport(token) {
  const headers = token === undefined ? {} : { Authorization: `Bearer ${token}` };
  return new StreamableHTTPClientTransport(new URL(env.url), { requestInit: { headers } });
}

async function connect(token) {
  const client = new Client({ name: 'vmgate-e2e-http', version: '1.0.0' });
  await client.connect(transport(token));
  return client;
}

// post sends one raw JSON-RPC body and returns the HTTP response.
function post(body, headers = {}) {
  return fetch(env.url, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      Authorization: `Bearer ${env.token}`,
      ...headers,
    },
    body,
  });
}

test('vmgate over streamable HTTP with the MCP SDK', { skip }, async (t) => {
  await t.test('401 without a token, with a wrong token; 403 for a foreign Origin', async () => {
    for (const token of [undefined, 'wrong-' + env.token, '']) {
      await assert.rejects(connect(token), (e) => /401|nauthorized/.test(String(e)), `connect with token ${JSON.stringify(token)?.slice(0, 12)}`);
    }
    const init = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } });
    let res = await post(init, { Authorization: 'Bearer nope' });
    assert.equal(res.status, 401);
    assert.match(res.headers.get('www-authenticate') ?? '', /^Bearer /);
    res = await post(init, { Authorization: '' });
    assert.equal(res.status, 401);
    res = await post(init, { Origin: 'http://evil.example' });
    assert.equal(res.status, 403);
    const call = JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'list_vms', arguments: {} } });
    res = await post(call, { Authorization: 'Basic ' + Buffer.from('agent:' + env.token).toString('base64') });
    assert.equal(res.status, 401, 'a token in another scheme');
  });

  const client = await connect(env.token);
  try {
    assert.equal(client.getServerVersion().name, 'vmgate');
    await t.test('tools/list: names, schemas, annotations', () => checkToolList(client));
    await t.test('list_vms', () => checkListVMs(client));
    await t.test('vm_agent_exec: echo, stdin, timeout', () => checkExec(client));
    await t.test('kill_process: pid 1 refused, 11th kill rate limited', () => checkKillRateLimit(client));
    await t.test('approvals through vmgate approvals', () => checkApproval(client, 'agent'));
    await t.test('bad input refused with its tag', () => checkBadInputs(client));
    await t.test('vmgate call --url against the same server', async () => {
      const { execFile } = await import('node:child_process');
      const run = (args, extraEnv) => new Promise((resolve) => {
        execFile(env.bin, args, { env: { ...process.env, ...extraEnv }, timeout: scaled(60_000) }, (err, stdout, stderr) =>
          resolve({ code: err ? err.code : 0, stdout, stderr }));
      });
      let r = await run(['call', 'vm_agent_exec', '--url', env.url, '--token-env', 'E2E_TOKEN', '--args', JSON.stringify({ vm: env.vm, command: ['echo', 'via call'] })], { E2E_TOKEN: env.token });
      assert.equal(r.code, 0, r.stderr);
      const out = JSON.parse(r.stdout);
      assert.equal(out.isError, false);
      assert.equal(out.structuredContent.stdout, 'via call\n');
      r = await run(['call', 'vm_status', '--url', env.url, '--token-env', 'E2E_TOKEN', '--args', JSON.stringify({ vm: env.otherVM })], { E2E_TOKEN: env.token });
      assert.equal(r.code, 1, 'exit 1 on isError');
      assert.ok(JSON.parse(r.stdout).text.startsWith(TAGS.unknownVM + ' '), r.stdout);
      r = await run(['call', 'list_vms', '--url', env.url, '--token-env', 'E2E_TOKEN'], { E2E_TOKEN: 'wrong' });
      assert.equal(r.code, 2, 'exit 2 when the call cannot be made (401)');
    });
  } finally {
    await client.close();
  }

  await t.test('raw bodies: duplicate and case-variant keys, batches', async () => {
    const bodies = [
      `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"kill_process","arguments":{"vm":"${env.vm}","pid":${env.sentinelPID},"pid":1}}}`,
      `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"kill_process","arguments":{"vm":"${env.vm}","vm":"${env.otherVM}","pid":${env.sentinelPID}}}}`,
      `{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"kill_process","arguments":{"vm":"${env.vm}","PID":${env.sentinelPID}}}}`,
      `{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"vm_agent_exec","arguments":{"vm":"${env.vm}","command":["kill","${env.sentinelPID}"]},"arguments":{}}}`,
    ];
    for (const body of bodies) {
      const res = await post(body);
      assert.equal(res.status, 200, body);
      const msg = await res.json();
      assert.equal(msg.result?.isError, true, `${body} -> ${JSON.stringify(msg)}`);
      assert.ok(msg.result.content[0].text.startsWith(TAGS.invalid + ' '), msg.result.content[0].text);
    }
    const res = await post(`[${bodies[0]}]`);
    const msg = await res.json();
    assert.ok(msg.error, `a batch gets a JSON-RPC error: ${JSON.stringify(msg)}`);
  });

  await t.test('the audit log records the refusals', async () => {
    const recs = await auditRecords();
    assert.ok(recs.some((r) => r.grant === 'agent' && r.transport === 'http' && r.decision === 'invalid' && r.tool === 'rm_everything'));
    assert.ok(recs.some((r) => r.grant === 'agent' && r.decision === 'rate_limited'));
    assert.ok(recs.some((r) => r.grant === 'agent' && r.decision === 'unknown_vm' && r.vm === env.otherVM));
    // The Go test verifies the chain once the server has stopped.
    const out = await vmgate('audit', 'verify', `${env.state}/audit.log`);
    assert.match(out, /^ok: /);
  });
});
