// The agent's side of every call (issue 17), with the official SDK over
// stdio as grant "agentside" (everything allowed; a kill must be TERM or
// KILL): every result's structuredContent is validated against its tool's
// outputSchema, the annotations of every tool are checked against one
// table, and a failing guest command, a missing file and a directory read
// come back with their cause.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, writeFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { env, missingEnv, TAGS, text, auditRecords, scaled } from './lib.mjs';

// The annotations every tool must have: destructive when it can change a
// guest, idempotent when a repeat changes nothing more, open-world when it
// reaches beyond the VM. A tool missing here fails the test.
const ANNOTATIONS = {
  list_vms: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_status: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  list_processes: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  list_sessions: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_agent_exec: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true },
  vm_agent_exec_status: { readOnlyHint: true, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  create_session: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  kill_process: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  destroy_session: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  vm_file_read: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_file_write: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  vm_power: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  snapshot_list: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  snapshot_create: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  snapshot_revert: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  snapshot_delete: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  vm_network: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_metrics: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  restore_session_files: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  vm_create: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  vm_delete: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
  vm_screenshot: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_send_keys: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true },
  vm_console_read: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_console_write: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true },
  vm_dir_list: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_archive_read: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  vm_archive_write: { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
};

// VMGATE_E2E_TOOLS=subset: the grant's policy denies the tools it does
// not list (suggest_test.go: a policy on trial, and the one `vmgate policy
// suggest` wrote from its log): tools/list may hold fewer than the table, and a call to a tool it does not hold (which
// the server refuses before its policy, as an unknown VM) has no schema
// to check.
const subset = process.env.VMGATE_E2E_TOOLS === 'subset';

const unknownVM = (vm) => `${TAGS.unknownVM} no VM ${JSON.stringify(vm)} (list_vms shows the VMs you can use)`;

async function connect() {
  const transport = new StdioClientTransport({
    command: env.bin,
    args: ['serve', '--config', env.config, '--grant', 'agentside'],
    env: { ...process.env, VMGATE_LOG_LEVEL: 'warn' },
    stderr: 'inherit',
  });
  const client = new Client({ name: 'vmgate-e2e-agent', version: '1.0.0' });
  await client.connect(transport);
  return client;
}

// Agent wraps the client: every call's structuredContent is validated
// against the tool's outputSchema (the SDK validates too; this says which
// field is wrong).
class Agent {
  constructor(client, tools) {
    this.client = client;
    const ajv = new Ajv({ strict: false, allErrors: true });
    addFormats(ajv);
    this.validators = Object.fromEntries(tools.map((t) => [t.name, ajv.compile(t.outputSchema)]));
    this.checked = 0;
  }

  async call(name, args) {
    const res = await this.client.callTool({ name, arguments: args }, undefined, { timeout: scaled(120_000) });
    const what = `${name}(${JSON.stringify(args)})`;
    assert.ok(res.structuredContent, `${what} = ${text(res)}: no structuredContent`);
    const valid = this.validators[name];
    if (!valid && subset) return res;
    assert.ok(valid, `${what}: no outputSchema for ${name}`);
    assert.ok(valid(res.structuredContent),
      `${what}: structuredContent ${JSON.stringify(res.structuredContent)} does not match its outputSchema: ${JSON.stringify(valid.errors)}`);
    this.checked++;
    return res;
  }

  async ok(name, args) {
    const res = await this.call(name, args);
    assert.equal(res.isError ?? false, false, `${name}(${JSON.stringify(args)}) = ${text(res)}; want success`);
    return res;
  }

  async fails(name, args, tag) {
    const res = await this.call(name, args);
    assert.equal(res.isError, true, `${name}(${JSON.stringify(args)}) = ${text(res)}; want an error`);
    assert.ok(text(res).startsWith(tag + ' '), `${name}(${JSON.stringify(args)}) = ${text(res)}; want ${tag}`);
    assert.equal(res.structuredContent.message, text(res).slice(tag.length + 1), 'structured message = the text after the tag');
    return res;
  }
}

// untilExited polls an exec_id until its command has exited (each poll is
// a round trip to the guest; bounded by count, not by time).
async function untilExited(agent, execID) {
  for (let i = 0; i < 200; i++) {
    const res = await agent.ok('vm_agent_exec_status', { vm: env.vm, exec_id: execID });
    if (res.structuredContent.exited) return res;
  }
  assert.fail(`exec ${execID} did not exit within 200 polls`);
}

test('the agent side of vmgate with the MCP SDK', { skip: missingEnv }, async (t) => {
  const client = await connect();
  try {
    const { tools } = await client.listTools();
    const agent = new Agent(client, tools);

    await t.test('tools/list: every tool has its annotations and an outputSchema', () => {
      if (subset) {
        assert.ok(tools.length > 0 && tools.every((x) => x.name in ANNOTATIONS), `tools/list ${tools.map((x) => x.name)}: tools of the table`);
      } else {
        assert.deepEqual(tools.map((x) => x.name).sort(), Object.keys(ANNOTATIONS).sort(), 'the tools of the table');
      }
      for (const tool of tools) {
        assert.deepEqual(
          Object.fromEntries(Object.keys(ANNOTATIONS[tool.name]).map((k) => [k, tool.annotations?.[k]])),
          ANNOTATIONS[tool.name], `${tool.name} annotations`);
        assert.equal(tool.outputSchema?.type, 'object', `${tool.name} has an outputSchema`);
      }
      const kill = tools.find((x) => x.name === 'kill_process');
      assert.ok(kill || subset, 'tools/list has kill_process');
      if (kill) assert.equal(kill.inputSchema.properties.signal.default, 'TERM', 'kill_process.signal default');
    });

    await t.test('a failing guest command, a missing file and a directory read say why', async () => {
      let res = await agent.fails('vm_agent_exec', { vm: env.vm, command: ['/nonexistent-e2e-agent'] }, TAGS.backend);
      assert.match(text(res), /not found: .*nonexistent-e2e-agent.*No such file or directory.*; check the path/);
      res = await agent.fails('vm_agent_exec', { vm: env.vm, command: ['/etc/hostname'] }, TAGS.backend);
      assert.match(text(res), /permission denied: .*Permission denied/);
      // The file tools run through vmgate-guest, which refuses what is not
      // there or not a file before opening anything.
      res = await agent.fails('vm_file_read', { vm: env.vm, path: '/nonexistent-e2e-agent' }, TAGS.invalid);
      assert.match(text(res), /not found: .*\/nonexistent-e2e-agent.*no such file or directory; check the path/);
      res = await agent.fails('vm_file_read', { vm: env.vm, path: '/etc' }, TAGS.invalid);
      assert.match(text(res), /it is a directory, not a file: .*\/etc is a directory; give a file's path/);
      // other/vm9 is configured, but no QEMU runs it: the backend says so.
      res = await agent.fails('vm_agent_exec', { vm: env.otherVM, command: ['true'] }, TAGS.backend);
      assert.match(text(res), /^\[BACKEND ERROR\] the VM is not running \(.*no QEMU listens on .*\); start it with vm_power start$/);
      // A command that runs and fails is a result, with its exit code.
      res = await agent.ok('vm_agent_exec', { vm: env.vm, shell: 'echo oops >&2; exit 3' });
      assert.equal(res.structuredContent.exit_code, 3);
      assert.equal(res.structuredContent.stderr, 'oops\n');
    });

    await t.test('a binary file comes back as content_base64', async () => {
      const bytes = Buffer.from([0x7f, 0x45, 0x4c, 0x46, 0, 0, 0, 1, 2, 0]);
      const path = `/tmp/vmgate-e2e-agent-${process.pid}.bin`;
      await agent.ok('vm_file_write', { vm: env.vm, path, content_base64: bytes.toString('base64') });
      const res = await agent.ok('vm_file_read', { vm: env.vm, path });
      assert.equal(res.structuredContent.content, undefined, 'no content with \\u0000 in it');
      assert.equal(res.structuredContent.content_base64, bytes.toString('base64'));
      assert.equal(res.structuredContent.bytes, bytes.length);
      await agent.ok('vm_agent_exec', { vm: env.vm, command: ['rm', '-f', path] });
    });

    await t.test('sessions: real times, the guest\'s workdir and tracking', async () => {
      const res = await agent.ok('create_session', { vm: env.vm, idle_s: 600, ttl_s: 900 });
      const s = res.structuredContent;
      const created = Date.parse(s.created);
      assert.ok(created > Date.parse('2020-01-01T00:00:00Z'), `created = ${s.created}`);
      assert.equal(Date.parse(s.last_used), created, `last_used = ${s.last_used}; want created`);
      assert.equal(Date.parse(s.idle_expires_at), created + 600_000, `idle_expires_at = ${s.idle_expires_at}`);
      assert.equal(Date.parse(s.expires_at), created + 900_000, `expires_at = ${s.expires_at}`);
      // A binary for no machine at all (through the guest agent, GLib hands
      // it to /bin/sh; vmgate-guest in a session does not). It lives in the
      // session's workdir: a sandboxed session has a /tmp of its own.
      const junk = `${s.workdir}/vmgate-e2e-agent-${process.pid}.junk`;
      await agent.ok('vm_file_write', { vm: env.vm, path: junk, content_base64: Buffer.from([0x7f, 0x45, 0x4c, 0x46, 9, 9, 9, 9]).toString('base64'), mode: 0o755 });
      try {
        let run = await agent.call('vm_agent_exec', { vm: env.vm, session: s.session, command: [junk] });
        assert.equal(run.isError, true, `exec of ${junk} in a session = ${text(run)}`);
        assert.match(text(run), /not a program this guest can run \(exec format error\): .*exec format error; a script needs its #! line/);
        run = await agent.call('vm_agent_exec', { vm: env.vm, session: s.session, command: ['/nonexistent-e2e-agent'] });
        assert.equal(run.isError, true, `exec of a missing program in a session = ${text(run)}`);
        assert.match(text(run), /not found: .*\/nonexistent-e2e-agent.*no such file or directory; check the path/);

        const list = await agent.ok('list_sessions', { vm: env.vm });
        const mine = list.structuredContent.sessions.find((x) => x.session === s.session);
        assert.ok(mine, `list_sessions has ${s.session}`);
        assert.ok(mine.workdir?.startsWith('/'), `list_sessions workdir = ${mine.workdir}`);
        assert.match(mine.tracking ?? '', /^(cgroup|pgid)/, `list_sessions tracking = ${mine.tracking}`);
        assert.equal(mine.workdir, s.workdir, 'the workdir create_session gave');
      } finally {
        await agent.ok('destroy_session', { vm: env.vm, session: s.session });
        await agent.ok('vm_agent_exec', { vm: env.vm, command: ['rm', '-f', junk] });
      }
    });

    await t.test('[UNKNOWN VM] is the same good message on every path', async () => {
      for (const vm of ['lab/vm9', 'nope/vm1']) {
        for (const [name, args] of [
          ['vm_status', { vm }],
          ['vm_agent_exec', { vm, command: ['true'] }],
          ['vm_file_read', { vm, path: '/etc/hostname' }],
          ['list_sessions', { vm }],
        ]) {
          const res = await agent.fails(name, args, TAGS.unknownVM);
          assert.equal(text(res), unknownVM(vm), `${name} on ${vm}`);
        }
      }
    });

    await t.test('wait: false: started_at goes back to kill_process; running has no exit code; defaults meet conditions', async () => {
      const started = await agent.ok('vm_agent_exec', { vm: env.vm, command: ['sleep', '300'], wait: false, timeout_s: 300 });
      const { exec_id: execID, pid, started_at: startedAt } = started.structuredContent;
      assert.ok(Number.isInteger(startedAt) && startedAt > Date.parse('2020-01-01T00:00:00Z'), `started_at = ${startedAt}; want ms`);
      const ps = await agent.ok('list_processes', { vm: env.vm });
      assert.equal(ps.structuredContent.processes.find((p) => p.pid === pid)?.started_at, startedAt, 'list_processes has the same started_at');

      const running = await agent.ok('vm_agent_exec_status', { vm: env.vm, exec_id: execID });
      assert.equal(running.structuredContent.exited, false);
      assert.equal('exit_code' in running.structuredContent, false, `running: ${JSON.stringify(running.structuredContent)}; want no exit_code`);
      assert.match(text(running), /^running \(pid \d+\)/);

      // The policy requires signal in [TERM, KILL]: HUP is denied, a kill
      // without signal is a TERM (its default) and allowed.
      await agent.fails('kill_process', { vm: env.vm, pid, signal: 'HUP', started_at: startedAt }, TAGS.denied);
      const kill = await agent.ok('kill_process', { vm: env.vm, pid, started_at: startedAt });
      assert.equal(kill.structuredContent.signal, 'TERM');
      assert.equal(kill.structuredContent.exited, true);
      const done = await untilExited(agent, execID);
      assert.equal(done.structuredContent.signal, 15, `after the kill: ${JSON.stringify(done.structuredContent)}`);
    });

    await t.test('vm_power start on a running VM says it was already running', async () => {
      const res = await agent.ok('vm_power', { vm: env.vm, action: 'start' });
      assert.equal(text(res), `${env.vm} was already running; start did nothing`);
      assert.equal(res.structuredContent.done, false);
      assert.equal(res.structuredContent.state, 'running');
    });

    await t.test('the audit log keeps the whole error', async () => {
      await agent.ok('list_vms', {}); // a decision record flushes the outcomes before it
      const recs = await auditRecords();
      const failed = recs.filter((r) => r.kind === 'outcome' && r.grant === 'agentside' && r.outcome === 'error');
      assert.ok(failed.some((r) => /qemu: exec.*backend error: the guest agent answered: .*No such file or directory/.test(r.reason ?? '')),
        `outcome records of agentside: ${JSON.stringify(failed.map((r) => r.reason))}`);
      assert.ok(agent.checked > 20, `validated ${agent.checked} results`);
    });
  } finally {
    await client.close();
  }
});

// A config without backends says so in the log at start.
test('vmgate serve without backends warns', { skip: missingEnv }, async () => {
  const dir = await mkdtemp(join(tmpdir(), 'vmgate-e2e-agent-'));
  try {
    const cfg = join(dir, 'vmgate.yaml');
    await writeFile(cfg, `state_dir: ${join(dir, 'state')}\ngrants:\n  - name: local\n    policy: "builtin:default"\n`);
    const child = spawn(env.bin, ['serve', '--config', cfg, '--grant', 'local'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (b) => { stderr += b; });
    const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
    child.stdin.end();
    assert.equal(await exited, 0, `vmgate serve exit code; stderr ${stderr}`);
    assert.match(stderr, /level=WARN.*no backends, so there is no VM to use/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
