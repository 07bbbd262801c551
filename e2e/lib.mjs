// Shared scenario of the end-to-end tests: the same checks run over stdio
// (stdio.test.mjs) and over streamable HTTP (http.test.mjs) with the
// official MCP TypeScript SDK as the client. The Go test e2e_test.go boots
// the lab VM, writes the config and passes everything through the
// environment (see env below); without it the tests skip.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const run = promisify(execFile);

// loadFactor scales the tests' failure deadlines with the machine's load:
// the Go test that starts node passes its testload factor (1 on an idle
// machine, at most 4).
export const loadFactor = Math.min(Math.max(Number(process.env.VMGATE_TEST_LOAD_FACTOR) || 1, 1), 4);

// scaled returns ms (a deadline for an idle machine) times loadFactor.
export function scaled(ms) {
  return Math.round(ms * loadFactor);
}

export const env = {
  bin: process.env.VMGATE_BIN,
  config: process.env.VMGATE_E2E_CONFIG,
  state: process.env.VMGATE_E2E_STATE,
  vm: process.env.VMGATE_E2E_VM,
  otherVM: process.env.VMGATE_E2E_OTHER_VM,
  sentinelFile: process.env.VMGATE_E2E_SENTINEL_FILE,
  sentinelText: process.env.VMGATE_E2E_SENTINEL_TEXT,
  sentinelPID: Number(process.env.VMGATE_E2E_SENTINEL_PID),
  url: process.env.VMGATE_E2E_URL,
  token: process.env.VMGATE_E2E_TOKEN,
};

export const missingEnv = !env.bin || !env.config || !env.vm
  ? 'run through `go test ./e2e` (it boots the lab VM and sets VMGATE_BIN, VMGATE_E2E_*)'
  : false;

export const TAGS = {
  denied: '[POLICY DENIED]',
  rate: '[RATE LIMITED]',
  approval: '[APPROVAL REQUIRED]',
  invalid: '[INVALID ARGUMENT]',
  unknownVM: '[UNKNOWN VM]',
  backend: '[BACKEND ERROR]',
  timedOut: '[TIMED OUT]',
};

export function text(res) {
  return (res.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

// call runs one tools/call and returns the result (tool errors included).
export async function call(client, name, args, timeout = scaled(120_000)) {
  return client.callTool({ name, arguments: args }, undefined, { timeout });
}

export async function ok(client, name, args) {
  const res = await call(client, name, args);
  assert.equal(res.isError ?? false, false, `${name}(${JSON.stringify(args)}) = ${text(res)}; want success`);
  return res;
}

export function assertTag(res, tag, what) {
  assert.equal(res.isError, true, `${what}: isError = ${res.isError}; want true (text ${text(res)})`);
  assert.ok(text(res).startsWith(tag + ' '), `${what}: text = ${JSON.stringify(text(res))}; want it to start with ${tag}`);
}

// connectStdio starts `vmgate serve --grant grant` as the SDK's stdio
// child and returns the connected client, named name.
export async function connectStdio(grant, name) {
  const transport = new StdioClientTransport({
    command: env.bin,
    args: ['serve', '--config', env.config, '--grant', grant],
    env: { ...process.env, VMGATE_LOG_LEVEL: 'warn' },
    stderr: 'inherit',
  });
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(transport);
  return client;
}

// vmgate runs the vmgate binary (approvals, audit) and returns stdout.
export async function vmgate(...args) {
  const { stdout } = await run(env.bin, args, { timeout: scaled(60_000) });
  return stdout;
}

const readOnly = ['list_vms', 'vm_status', 'list_processes', 'list_sessions', 'vm_agent_exec_status', 'vm_file_read'];
const destructive = ['vm_agent_exec', 'kill_process', 'destroy_session', 'vm_file_write', 'vm_power',
  'snapshot_create', 'snapshot_revert', 'snapshot_delete', 'restore_session_files'];
const openWorld = ['vm_agent_exec'];

export async function checkToolList(client) {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, [
    'create_session', 'destroy_session', 'kill_process', 'list_processes', 'list_sessions', 'list_vms',
    'vm_agent_exec', 'vm_agent_exec_status', 'vm_file_read', 'vm_file_write', 'vm_status',
  ], 'tools/list (vm_power is hidden by the policy)');
  for (const t of tools) {
    const a = t.annotations ?? {};
    assert.equal(a.readOnlyHint, readOnly.includes(t.name), `${t.name}.readOnlyHint`);
    if (!readOnly.includes(t.name)) {
      assert.equal(a.destructiveHint, destructive.includes(t.name), `${t.name}.destructiveHint`);
    }
    assert.equal(a.openWorldHint, openWorld.includes(t.name), `${t.name}.openWorldHint`);
    assert.equal(t.inputSchema.type, 'object', `${t.name}.inputSchema.type`);
    assert.equal(t.inputSchema.additionalProperties, false, `${t.name}.inputSchema.additionalProperties`);
    assert.ok(t.description && t.description.length > 20, `${t.name} has a description an agent can act on`);
    if (t.name !== 'list_vms' && t.name !== 'list_sessions') {
      assert.ok(t.inputSchema.required?.includes('vm'), `${t.name} requires vm`);
    }
  }
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  assert.equal(byName.destroy_session.annotations.idempotentHint, true, 'destroy_session.idempotentHint');
  const exec = byName.vm_agent_exec.inputSchema.properties;
  assert.equal(exec.command.type, 'array', 'vm_agent_exec.command is an argv array');
  assert.equal(exec.command.items.type, 'string', 'vm_agent_exec.command items');
  assert.equal(exec.wait.type, 'boolean', 'vm_agent_exec.wait');
  const kill = byName.kill_process.inputSchema;
  assert.equal(kill.properties.pid.type, 'integer', 'kill_process.pid');
  assert.ok(kill.properties.signal.enum.includes('KILL') && !kill.properties.signal.enum.includes('9'), 'kill_process.signal enum');
  assert.deepEqual([...kill.required].sort(), ['pid', 'vm'], 'kill_process.required');
}

export async function checkListVMs(client) {
  const res = await ok(client, 'list_vms', {});
  const ids = res.structuredContent.vms.map((v) => v.id);
  assert.ok(ids.includes(env.vm), `list_vms = ${ids}; want ${env.vm}`);
  assert.ok(!ids.some((id) => id.startsWith('other/')), `list_vms = ${ids}; another grant's VMs must not show`);
  assert.equal(res.structuredContent.vms.find((v) => v.id === env.vm).state, 'running');
}

export async function checkExec(client) {
  const word = `hello-${process.pid}-${Date.now()}`;
  let res = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['echo', word] });
  assert.equal(res.structuredContent.stdout, word + '\n');
  assert.equal(res.structuredContent.exit_code, 0);
  assert.equal(res.structuredContent.timed_out, false);

  res = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['cat'], stdin: `from stdin ${word}\n` });
  assert.equal(res.structuredContent.stdout, `from stdin ${word}\n`);

  // The argv is not a shell: a ; is an argument.
  res = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['echo', 'a;', 'echo', 'b'] });
  assert.equal(res.structuredContent.stdout, 'a; echo b\n');

  res = await call(client, 'vm_agent_exec', { vm: env.vm, command: ['/bin/sh', '-c', 'echo partial; sleep 60'], timeout_s: 2 });
  assertTag(res, TAGS.timedOut, 'exec with a timeout');
  assert.equal(res.structuredContent.timed_out, true);
  assert.equal(res.structuredContent.stdout, 'partial\n', 'partial output of the timed-out command');
}

// sleeper starts a sleeping process in the guest (wait: false) and returns its pid.
async function sleeper(client) {
  const res = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['sleep', '300'], wait: false, timeout_s: 300 });
  const pid = res.structuredContent.pid;
  assert.ok(Number.isInteger(pid) && pid > 1, `sleeper pid ${pid}`);
  return pid;
}

// checkKillRateLimit: kill_process is limited to 10 a minute per grant, so
// 10 kills succeed and the 11th is rate limited with a retry time. pid 1
// is refused (and costs nothing of the budget).
export async function checkKillRateLimit(client) {
  // pid 1 is refused: by the kill guard ([INVALID ARGUMENT] refused: …) or
  // the policy ([POLICY DENIED]); either way nothing is signalled.
  const refused = await call(client, 'kill_process', { vm: env.vm, pid: 1, signal: 'KILL' });
  assert.equal(refused.isError, true, `kill_process of pid 1 = ${text(refused)}`);
  assert.match(text(refused), /^\[(INVALID ARGUMENT|POLICY DENIED)\] .*\b(pid 1|init)\b/, 'kill_process of pid 1');
  for (let i = 1; i <= 10; i++) {
    const pid = await sleeper(client);
    const res = await ok(client, 'kill_process', { vm: env.vm, pid, signal: i % 2 ? 'KILL' : 'TERM' });
    assert.equal(res.structuredContent.pid, pid);
    assert.equal(res.structuredContent.exited, true, `kill ${i} of pid ${pid}: exited`);
  }
  const pid = await sleeper(client);
  const res = await call(client, 'kill_process', { vm: env.vm, pid, signal: 'KILL' });
  assertTag(res, TAGS.rate, 'the 11th kill within a minute');
  assert.match(text(res), /retry in [0-9]+ s/);
  assert.ok(res.structuredContent.retry_after_s >= 1 && res.structuredContent.retry_after_s <= 60,
    `retry_after_s = ${res.structuredContent.retry_after_s}`);
  // The rate-limited kill did nothing: the sleeper still runs.
  const ps = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['cat', `/proc/${pid}/cmdline`] });
  assert.equal(ps.structuredContent.stdout, 'sleep\u0000300\u0000');
}

// checkApproval: vm_file_read needs an operator's approval; `vmgate
// approvals grant` lets the identical retry through once.
export async function checkApproval(client, grant) {
  const args = { vm: env.vm, path: env.sentinelFile };
  let res = await call(client, 'vm_file_read', args);
  assertTag(res, TAGS.approval, 'vm_file_read before approval');
  const id = res.structuredContent.approval_id;
  assert.match(id, /^[A-Z2-7]{16,}$/);

  const list = JSON.parse(await vmgate('approvals', 'list', '--json', '--config', env.config));
  const pending = list.find((a) => a.id === id);
  assert.ok(pending, `approvals list has ${id}`);
  assert.equal(pending.state, 'pending');
  assert.equal(pending.grant, grant);
  assert.equal(pending.tool, 'vm_file_read');

  const out = await vmgate('approvals', 'grant', id, '--reason', 'e2e test', '--config', env.config);
  assert.match(out, new RegExp(`^${id} granted by \\S+`));

  res = await ok(client, 'vm_file_read', args);
  assert.equal(res.structuredContent.content, env.sentinelText + '\n', 'the approved read');

  res = await call(client, 'vm_file_read', args);
  assertTag(res, TAGS.approval, 'a second retry after one approval');
  const second = res.structuredContent.approval_id;
  assert.notEqual(second, id);

  await vmgate('approvals', 'grant', second, '--config', env.config);
  res = await call(client, 'vm_file_read', { ...args, max_bytes: 4 });
  assertTag(res, TAGS.approval, 'a retry with different arguments');
  assert.notEqual(res.structuredContent.approval_id, second);
  // The approval of the identical call is still there, unused.
  res = await ok(client, 'vm_file_read', args);
  assert.equal(res.structuredContent.content, env.sentinelText + '\n');

  // A denied approval lets nothing through.
  res = await call(client, 'vm_file_read', { ...args, max_bytes: 8 });
  const third = res.structuredContent.approval_id;
  await vmgate('approvals', 'deny', third, '--reason', 'no', '--config', env.config);
  res = await call(client, 'vm_file_read', { ...args, max_bytes: 8 });
  assert.equal(res.isError, true, 'a retry after deny');
  assert.doesNotMatch(text(res), new RegExp(env.sentinelText));
}

// badInputs are refused through the real client, each with its tag.
export function badInputs() {
  const vm = env.vm;
  const nul = 'a\u0000b';
  return [
    { what: 'unknown tool', name: 'rm_everything', args: { vm }, tag: TAGS.invalid },
    { what: 'hidden tool', name: 'vm_power', args: { vm, action: 'stop' }, tag: TAGS.denied },
    { what: 'unknown VM', name: 'vm_status', args: { vm: 'nope/vm1' }, tag: TAGS.unknownVM },
    { what: 'unknown VM of a known backend', name: 'vm_status', args: { vm: 'lab/nope' }, tag: TAGS.unknownVM },
    { what: "another grant's VM", name: 'vm_status', args: { vm: env.otherVM }, tag: TAGS.unknownVM },
    { what: "another grant's VM, exec", name: 'vm_agent_exec', args: { vm: env.otherVM, command: ['true'] }, tag: TAGS.unknownVM },
    { what: 'missing argument', name: 'vm_agent_exec', args: { command: ['true'] }, tag: TAGS.invalid },
    { what: 'extra argument', name: 'vm_status', args: { vm, force: true }, tag: TAGS.invalid },
    { what: 'case-variant key', name: 'vm_status', args: { VM: vm }, tag: TAGS.invalid },
    { what: 'pid as string', name: 'kill_process', args: { vm, pid: String(env.sentinelPID) }, tag: TAGS.invalid },
    { what: 'command as string', name: 'vm_agent_exec', args: { vm, command: `kill ${env.sentinelPID}` }, tag: TAGS.invalid },
    { what: 'timeout as float', name: 'vm_agent_exec', args: { vm, command: ['true'], timeout_s: 1.5 }, tag: TAGS.invalid },
    { what: 'NUL in argv', name: 'vm_agent_exec', args: { vm, command: ['rm', nul] }, tag: TAGS.invalid },
    { what: 'NUL in path', name: 'vm_file_read', args: { vm, path: `${env.sentinelFile}${nul}` }, tag: TAGS.invalid },
    { what: 'negative pid', name: 'kill_process', args: { vm, pid: -env.sentinelPID }, tag: TAGS.invalid },
    { what: 'huge pid', name: 'kill_process', args: { vm, pid: 2 ** 53 - 1 }, tag: TAGS.invalid },
    { what: 'signal with a shell', name: 'kill_process', args: { vm, pid: env.sentinelPID, signal: '9; rm -rf /' }, tag: TAGS.invalid },
    { what: 'signal number', name: 'kill_process', args: { vm, pid: env.sentinelPID, signal: '9' }, tag: TAGS.invalid },
    { what: 'file write', name: 'vm_file_write', args: { vm, path: env.sentinelFile, content: 'overwritten' }, tag: TAGS.denied },
  ];
}

export async function checkBadInputs(client) {
  for (const tc of badInputs()) {
    const res = await call(client, tc.name, tc.args);
    assertTag(res, tc.tag, tc.what);
  }
  // A 20 MB argument: refused, by a tool error or a protocol error.
  const big = 'x'.repeat(20 << 20);
  let refused;
  try {
    const res = await call(client, 'vm_agent_exec', { vm: env.vm, command: ['cat'], stdin: big });
    refused = res.isError === true ? text(res) : false;
  } catch (e) {
    refused = String(e);
  }
  assert.ok(refused, 'a 20 MB argument must be refused');
  // The sentinels are checked by the Go test after the run; the client
  // still works after the bad inputs.
  await ok(client, 'list_vms', {});
}

// auditRecords reads the audit log (JSON lines).
export async function auditRecords() {
  const { readFile } = await import('node:fs/promises');
  const data = await readFile(`${env.state}/audit.log`, 'utf8');
  return data.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}
