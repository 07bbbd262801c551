// End-to-end: undo. The Go test (undo_test.go) starts `vmgate serve
// --http` with grant "undo", whose policy snapshots the VM before any exec
// that runs `rm -rf` (snapshot_before), wants an operator's approval for
// snapshot_revert, keeps a destroyed session's files for an hour
// (keep_files), and lets the agent read vm_network and vm_metrics.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, missingEnv, TAGS, text, call, ok, assertTag, vmgate, auditRecords } from './lib.mjs';

const undoToken = process.env.VMGATE_E2E_UNDO_TOKEN;
const skip = missingEnv || (!env.url || !undoToken ? 'VMGATE_E2E_URL and the undo grant are set by `go test ./e2e -run TestNodeSDKUndo`' : false);

async function connect(name) {
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(env.url), {
    requestInit: { headers: { Authorization: `Bearer ${undoToken}` } },
  }));
  return client;
}

async function sh(client, shell, extra = {}) {
  const res = await ok(client, 'vm_agent_exec', { vm: env.vm, shell, timeout_s: 120, ...extra });
  return res;
}

const stdout = (res) => Buffer.from(res.structuredContent.stdout ?? '', 'utf8').toString();

test('snapshot_before, then the operator undoes the call: the guest is as before', { skip }, async () => {
  const client = await connect('vmgate-e2e-undo');
  try {
    const mark = `mark-${Date.now()}`;
    await sh(client, `mkdir -p /data/project && printf '%s\\n' ${mark} > /data/project/README && printf 'ram\\n' > /tmp/undo-ram && sync`);

    // The destructive call: the policy names it (rm -rf), so a snapshot is taken first.
    const res = await sh(client, 'rm -rf /data/project /tmp/undo-ram && sync && echo gone');
    const snap = res.structuredContent.undo_snapshot;
    const callID = res.structuredContent.undo_call;
    assert.match(snap ?? '', /^vmgate-undo-[0-9a-z]+-[0-9a-z]+$/, `undo_snapshot of the rm -rf call: ${text(res)}`);
    assert.ok(text(res).includes(`undo: snapshot ${snap} of ${env.vm}`), `the result names the snapshot: ${text(res)}`);
    assert.ok(text(res).includes(`vmgate undo ${callID}`), `the result names the call to undo: ${text(res)}`);
    assert.equal(stdout(await sh(client, 'ls /data/project 2>&1 || echo missing')).trim().endsWith('missing'), true, 'the call ran');

    // An exec the policy does not name takes no snapshot.
    assert.equal((await sh(client, 'true')).structuredContent.undo_snapshot, undefined, 'no snapshot for a harmless exec');

    const listed = await ok(client, 'snapshot_list', { vm: env.vm });
    assert.ok(listed.structuredContent.snapshots.some((s) => s.name === snap && s.memory === true && s.owner === 'undo'),
      `snapshot_list lists ${snap} with memory, owned by grant undo: ${text(listed)}`);

    // The agent cannot revert or delete the server's undo snapshot.
    for (const tool of ['snapshot_revert', 'snapshot_delete']) {
      assertTag(await call(client, tool, { vm: env.vm, name: snap }, 600_000), TAGS.invalid, `${tool} of the undo snapshot`);
    }

    // The operator finds the call with vmgate undo --list (from the audit log, newest first)...
    const undoList = async (...args) => JSON.parse(await vmgate('undo', '--list', '--json', '--config', env.config, ...args));
    let listed1;
    for (let i = 0; i < 30 && !listed1; i++) { // the outcome record rides the next group commit
      listed1 = (await undoList()).find((u) => u.call_id === callID);
      if (!listed1) await sh(client, 'true');
    }
    assert.ok(listed1, `vmgate undo --list lists the rm -rf call ${callID}: ${JSON.stringify(await undoList())}`);
    const outcomeRec = (await auditRecords()).find((r) => r.kind === 'outcome' && r.call_id === callID);
    assert.deepEqual(
      { grant: listed1.grant, tool: listed1.tool, vm: listed1.vm, snapshot: listed1.snapshot, snapshot_id: listed1.snapshot_id, undone: listed1.undone },
      { grant: 'undo', tool: 'vm_agent_exec', vm: env.vm, snapshot: snap, snapshot_id: outcomeRec.snapshot_id, undone: undefined },
      'undo --list: what the call did and the snapshot\'s identity, as its outcome record has them');
    assert.ok(Date.parse(listed1.expires) > Date.now() + 50 * 60_000, `expires within the 1h retention: ${listed1.expires}`);
    assert.equal((await undoList()).findIndex((u) => u.call_id === callID), 0, 'the newest call first');
    assert.ok((await undoList('--grant', 'undo', '--vm', env.vm)).some((u) => u.call_id === callID), 'undo --list --grant undo --vm');
    assert.deepEqual(await undoList('--grant', 'someone-else'), [], 'undo --list --grant of another grant lists nothing');
    const table = await vmgate('undo', '--list', '--config', env.config);
    assert.ok(table.split('\n').some((l) => l.startsWith(callID) && l.includes(snap) && l.includes(env.vm)), `the table has the call: ${table}`);

    // ...and undoes it, behind an approval.
    const park = await vmgate('undo', callID, '--config', env.config);
    const id = park.match(/vmgate approvals grant ([A-Z2-7]+)/)?.[1];
    assert.ok(id, `vmgate undo parks an approval: ${park}`);
    await vmgate('approvals', 'grant', id, '--reason', 'e2e: undo the rm -rf', '--config', env.config);
    const done = await vmgate('undo', callID, '--config', env.config);
    assert.ok(done.includes(`reverted to snapshot ${snap}`), `vmgate undo after the approval: ${done}`);

    // The guest is as before: the disk and the memory.
    let after;
    for (let i = 0; i < 60; i++) { // the agent channel comes back with the restored guest
      after = await call(client, 'vm_agent_exec', { vm: env.vm, shell: 'cat /data/project/README /tmp/undo-ram', timeout_s: 60 });
      if (!after.isError) break;
      await new Promise((r) => setTimeout(r, 1000));
    }
    assert.equal(stdout(after), `${mark}\nram\n`, `files after the revert: ${text(after)}`);
    const undone = (await undoList()).find((u) => u.call_id === callID);
    assert.ok(undone?.undone, `undo --list shows when the call was undone: ${JSON.stringify(undone)}`);

    const records = await auditRecords();
    const outcome = records.find((r) => r.kind === 'outcome' && r.snapshot === snap && r.tool === 'vm_agent_exec');
    assert.ok(outcome?.snapshot_id && outcome.call_id === callID, 'the outcome record of the rm -rf call names its snapshot and its identity');
    await sh(client, 'rm -r -f /data/project /tmp/undo-ram'); // not rm -rf: no snapshot for the cleanup
  } finally {
    await client.close();
  }
});

test('destroy_session keeps the files; restore_session_files brings them into a new session', { skip }, async () => {
  const client = await connect('vmgate-e2e-trash');
  try {
    const old = (await ok(client, 'create_session', { vm: env.vm })).structuredContent;
    await sh(client, `mkdir -p src && printf 'kept\\n' > src/notes.txt`, { session: old.session });
    const d = await ok(client, 'destroy_session', { vm: env.vm, session: old.session });
    assert.ok(d.structuredContent.files_kept_until, `destroy_session keeps the files: ${text(d)}`);
    const fresh = (await ok(client, 'create_session', { vm: env.vm })).structuredContent;
    const r = await ok(client, 'restore_session_files', { vm: env.vm, session: fresh.session, from: old.session });
    assert.deepEqual(r.structuredContent.entries, ['src'], `restored entries: ${text(r)}`);
    const cat = await sh(client, 'cat src/notes.txt && touch src/writable', { session: fresh.session });
    assert.equal(stdout(cat), 'kept\n', 'the new session reads (and writes) the restored files');
    const again = await call(client, 'restore_session_files', { vm: env.vm, session: fresh.session, from: old.session });
    assertTag(again, TAGS.invalid, 'a second restore');
    await ok(client, 'destroy_session', { vm: env.vm, session: fresh.session });
  } finally {
    await client.close();
  }
});

test('vm_network returns the lab VM\'s addresses; vm_metrics moves under load', { skip }, async () => {
  const client = await connect('vmgate-e2e-observe');
  try {
    const net = await ok(client, 'vm_network', { vm: env.vm });
    const ifs = net.structuredContent.interfaces;
    const names = stdout(await sh(client, 'ls /sys/class/net')).trim().split(/\s+/).sort();
    assert.deepEqual(ifs.map((i) => i.name).sort(), names, `vm_network names = the guest's /sys/class/net: ${text(net)}`);
    const lo = ifs.find((i) => i.name === 'lo');
    assert.ok(lo?.addresses.some((a) => a.family === 'ipv4' && a.address === '127.0.0.1' && a.prefix === 8), `lo has 127.0.0.1/8: ${text(net)}`);
    for (const i of ifs.filter((i) => i.name !== 'lo')) {
      const mac = stdout(await sh(client, `cat /sys/class/net/${i.name}/address`)).trim();
      assert.equal(i.mac, mac, `${i.name} MAC`);
    }

    const read = async () => (await ok(client, 'vm_metrics', { vm: env.vm, sample_ms: 1000 })).structuredContent;
    const idle = await read();
    assert.ok(idle.guest.cpu.count >= 1 && idle.guest.memory.total_bytes > 0, `idle figures: ${JSON.stringify(idle.guest.cpu)}`);
    assert.ok(idle.hypervisor?.source, `hypervisor figures from the QEMU backend: ${JSON.stringify(idle)}`);
    const hogs = stdout(await sh(client, `(while :; do :; done) >/dev/null 2>&1 & echo $!; (dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 600) >/dev/null 2>&1 & echo $!`)).trim().split(/\s+/);
    try {
      let busy;
      for (let i = 0; i < 60; i++) {
        busy = await read();
        if (busy.guest.cpu.percent >= 80 && busy.guest.memory.used_bytes >= idle.guest.memory.used_bytes + 48 * 2 ** 20) break;
      }
      assert.ok(busy.guest.cpu.percent >= 80, `CPU under load ${busy.guest.cpu.percent}% (idle ${idle.guest.cpu.percent}%)`);
      assert.ok(busy.guest.memory.used_bytes >= idle.guest.memory.used_bytes + 48 * 2 ** 20,
        `memory used under load ${busy.guest.memory.used_bytes >> 20} MiB (idle ${idle.guest.memory.used_bytes >> 20} MiB)`);
      assert.ok(BigInt(busy.hypervisor.cpu_time_ns) > BigInt(idle.hypervisor.cpu_time_ns), 'the host saw the vCPU work');
    } finally {
      await sh(client, `kill -9 ${hogs.join(' ')}`);
    }
  } finally {
    await client.close();
  }
});
