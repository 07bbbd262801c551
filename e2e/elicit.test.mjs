// End-to-end client approval over stdio with the SDK's Client as an
// elicitation-capable client older than protocol 2026-07-28: vm_status of
// the grant "elicit" needs the approval of the client's user, which vmgate
// asks for with a server-to-client elicitation/create request. Only an
// explicit approve lets the call run; a decline, a cancel or a client
// without the capability get [POLICY DENIED].
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { env, missingEnv, TAGS, call, text, assertTag, auditRecords } from './lib.mjs';

// connect starts `vmgate serve --grant elicit`; answer (if any) is the
// user: it gets the elicitation request and returns the result.
async function connect(answer) {
  const transport = new StdioClientTransport({
    command: env.bin,
    args: ['serve', '--config', env.config, '--grant', 'elicit'],
    env: { ...process.env, VMGATE_LOG_LEVEL: 'warn' },
    stderr: 'inherit',
  });
  const capabilities = answer ? { elicitation: {} } : {};
  const client = new Client({ name: 'vmgate-e2e-elicit', version: '1.0.0' }, { capabilities });
  const asked = [];
  if (answer) {
    client.setRequestHandler(ElicitRequestSchema, async (req) => {
      asked.push(req.params);
      return answer(req.params);
    });
  }
  await client.connect(transport);
  return { client, asked };
}

async function statusWith(answer) {
  const { client, asked } = await connect(answer);
  try {
    return { res: await call(client, 'vm_status', { vm: env.vm }, 60_000), asked };
  } finally {
    await client.close();
  }
}

test('client approval through elicitation/create with the MCP SDK', { skip: missingEnv }, async (t) => {
  await t.test('approve: the call runs in the same request', async () => {
    const { res, asked } = await statusWith(() => ({ action: 'accept', content: { approve: true } }));
    assert.equal(res.isError ?? false, false, `vm_status = ${text(res)}; want success`);
    assert.equal(asked.length, 1, 'elicitation requests');
    assert.match(asked[0].message, /vm_status on lab\//);
    assert.equal(asked[0].requestedSchema.properties.approve.type, 'boolean');
  });
  const denials = [
    ['decline', () => ({ action: 'decline' })],
    ['cancel', () => ({ action: 'cancel' })],
    ['accept without approve', () => ({ action: 'accept', content: { approve: false } })],
  ];
  for (const [name, answer] of denials) {
    await t.test(`${name}: denied`, async () => {
      const { res, asked } = await statusWith(answer);
      assertTag(res, TAGS.denied, name);
      assert.equal(asked.length, 1, 'elicitation requests');
    });
  }
  await t.test('no elicitation capability: denied without asking', async () => {
    const { res } = await statusWith(null);
    assertTag(res, TAGS.denied, 'no capability');
    assert.match(text(res), /elicitation/);
  });
  await t.test('audit: one allow and four denials answered through elicitation', async () => {
    const recs = (await auditRecords()).filter((r) => r.grant === 'elicit' && r.kind === 'decision' && r.approval_id === 'client');
    const answers = recs.filter((r) => r.decision !== 'approve');
    assert.deepEqual(answers.map((r) => r.decision), ['allow', 'deny', 'deny', 'deny', 'deny'], JSON.stringify(answers));
    assert.match(answers[0].reason, /approved by the client's user/);
    assert.match(answers[1].reason, /client approval: decline/);
    assert.match(answers[4].reason, /no elicitation capability/);
  });
  // Issue 29, finding 6: the approval showed the arguments cut to 400
  // characters, so a tail behind 420 spaces ran unseen.
  await t.test('a command whose tail hides behind 420 spaces: the user sees the tail', async () => {
    const tail = `&& echo TAIL > /tmp/vmgate-e2e-elicit-tail-${process.pid}`;
    const shell = "echo 'routine log rotation'" + ' '.repeat(420) + tail;
    const { client, asked } = await connect(() => ({ action: 'decline' }));
    try {
      assertTag(await call(client, 'vm_agent_exec', { vm: env.vm, shell }, 60_000), TAGS.denied, 'declined');
    } finally {
      await client.close();
    }
    assert.equal(asked.length, 1, 'elicitation requests');
    assert.ok(asked[0].message.includes("echo 'routine log rotation'⟦420 spaces⟧" + tail), asked[0].message);
    assert.doesNotMatch(asked[0].message, / {3}/, 'a run of spaces in the message');
  });
  await t.test('arguments too long to show in full: refused without asking', async () => {
    const { client, asked } = await connect(() => ({ action: 'accept', content: { approve: true } }));
    try {
      const res = await call(client, 'vm_agent_exec', { vm: env.vm, shell: 'echo ' + 'a'.repeat(9000) }, 60_000);
      assertTag(res, TAGS.denied, 'too long');
      assert.match(text(res), /too long to show in full.*approval channel "operator"/);
    } finally {
      await client.close();
    }
    assert.equal(asked.length, 0, 'elicitation requests');
  });
});
