// End-to-end: undo that cannot be forged (issue 29, finding 4). The Go test
// (undo_test.go, TestNodeSDKUndoTwoGrants) starts `vmgate serve --http`
// with two grants on two lab VMs and runs this file twice, restarting the
// server in between:
//
//   phase 1: alpha's destructive exec takes an undo snapshot on the first
//     VM; beta cannot delete, revert or re-create a snapshot of that name
//     (in any case); the approval `vmgate undo` parks shows when the
//     snapshot was taken and what call it undoes; a snapshot of the same
//     name is made on the second VM behind vmgate's back (QMP savevm).
//   phase 2 (after the restart): `vmgate undo` reverts the first VM, the
//     VM of the call, and leaves the second alone; then a second undo
//     snapshot is replaced behind vmgate's back (QMP delvm + savevm of a
//     planted state), and `vmgate undo` refuses it and reverts nothing.
//
// What phase 1 learns (call id, snapshot, approval) goes to the JSON file
// VMGATE_E2E_SHARED for phase 2.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { readFile, writeFile } from 'node:fs/promises';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { env, missingEnv, TAGS, text, call, ok, assertTag, vmgate, auditRecords, scaled } from './lib.mjs';

const run = promisify(execFile);
const e = process.env;
const vm1 = e.VMGATE_E2E_VM;
const vm2 = e.VMGATE_E2E_TWIN_VM;
const phase = e.VMGATE_E2E_PHASE;
const skip = missingEnv || (!env.url || !e.VMGATE_E2E_ALPHA_TOKEN || !vm2 || !phase
  ? 'run through `go test ./e2e -run TestNodeSDKUndoTwoGrants`' : false);

async function connect(token, name) {
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(env.url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  }));
  return client;
}

const stdout = (res) => res.structuredContent.stdout ?? '';

async function sh(client, vm, shell) {
  return stdout(await ok(client, 'vm_agent_exec', { vm, shell, timeout_s: 120 }));
}

// hmp runs one human-monitor command on a VM's QMP socket, straight to
// QEMU (behind vmgate's back), and returns its output.
function hmp(sock, commandLine) {
  return new Promise((resolve, reject) => {
    const c = net.createConnection(sock);
    let buf = '';
    let step = 0;
    const timer = setTimeout(() => { c.destroy(); reject(new Error(`hmp ${commandLine}: no answer`)); }, 300_000);
    c.on('error', (err) => { clearTimeout(timer); reject(err); });
    c.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const msg = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        if (msg.event) continue;
        if (step === 0 && msg.QMP) {
          c.write(JSON.stringify({ execute: 'qmp_capabilities' }) + '\n');
          step = 1;
        } else if (step === 1) {
          c.write(JSON.stringify({ execute: 'human-monitor-command', arguments: { 'command-line': commandLine } }) + '\n');
          step = 2;
        } else if (step === 2) {
          clearTimeout(timer);
          c.end();
          if (msg.error) reject(new Error(`hmp ${commandLine}: ${msg.error.desc}`));
          else resolve(msg.return);
        }
      }
    });
  });
}

async function savevm(sock, name) {
  const out = await hmp(sock, `savevm ${name}`);
  assert.equal(out.trim(), '', `savevm ${name}: ${out}`);
}

// tryVmgate runs the vmgate binary and reports its exit instead of throwing.
async function tryVmgate(...args) {
  try {
    const { stdout } = await run(env.bin, args, { timeout: scaled(600_000) });
    return { ok: true, out: stdout };
  } catch (err) {
    return { ok: false, out: (err.stdout ?? '') + (err.stderr ?? '') };
  }
}

// operatorUndo runs `vmgate undo` as a careless operator would: a parked
// approval is granted unseen and the undo run again.
async function operatorUndo(callID) {
  let r = await tryVmgate('undo', callID, '--config', env.config);
  const id = r.out.match(/vmgate approvals grant ([A-Z2-7]+)/)?.[1];
  if (r.ok && id) {
    await vmgate('approvals', 'grant', id, '--reason', 'e2e: careless', '--config', env.config);
    r = await tryVmgate('undo', callID, '--config', env.config);
  }
  return r;
}

// phase1: beta cannot touch alpha's undo snapshot; the approval shows what it undoes.
async function phase1() {
  const alpha = await connect(e.VMGATE_E2E_ALPHA_TOKEN, 'alpha');
  const beta = await connect(e.VMGATE_E2E_BETA_TOKEN, 'beta');
  try {
    const mark = `alpha-${Date.now()}`;
    await sh(alpha, vm1, `mkdir -p /data/undo-e2e && printf '%s\\n' ${mark} > /data/undo-e2e/mark && printf 'ram\\n' > /tmp/undo-ram && sync`);
    const res = await ok(alpha, 'vm_agent_exec', { vm: vm1, shell: 'rm -rf /data/undo-e2e /tmp/undo-ram && sync', timeout_s: 120 });
    const sc = res.structuredContent;
    const snap = sc.undo_snapshot;
    const callID = sc.undo_call;
    assert.match(snap ?? '', /^vmgate-undo-[0-9a-z]+-[0-9a-z]+$/, `undo_snapshot: ${text(res)}`);
    assert.match(callID ?? '', /^[A-Z2-7]{26}$/, `undo_call in structuredContent: ${JSON.stringify(sc)}`);
    assert.ok(sc.undo_taken, `undo_taken in structuredContent: ${JSON.stringify(sc)}`);
    assert.ok(text(res).includes(`vmgate undo ${callID}`), `the text names the call id: ${text(res)}`);

    // beta, allowed every snapshot tool without approval, cannot touch it.
    for (const [tool, name] of [['snapshot_delete', snap], ['snapshot_revert', snap], ['snapshot_create', snap],
      ['snapshot_create', snap.toUpperCase()], ['snapshot_delete', snap.replace('vmgate-undo', 'VMGATE_UNDO')]]) {
      const r = await call(beta, tool, { vm: vm1, name }, 600_000);
      assertTag(r, TAGS.invalid, `beta ${tool} ${name}`);
      assert.match(text(r), /belong to the server's undo snapshots/, `beta ${tool} ${name} says why`);
    }
    const listed = await ok(beta, 'snapshot_list', { vm: vm1 });
    const mine = listed.structuredContent.snapshots.find((s) => s.name === snap);
    assert.ok(mine, `beta's snapshot_list still shows ${snap}: ${text(listed)}`);
    assert.equal(mine.owner, 'alpha', `the undo snapshot is alpha's: ${JSON.stringify(mine)}`);
    // beta plants a file after the snapshot: the undo must not bring it back, nor keep it.
    await sh(beta, vm1, 'mkdir -p /data/undo-e2e && echo beta > /data/undo-e2e/planted && sync');

    // The operator's view: when the snapshot was taken, what call it undoes.
    const park = await vmgate('undo', callID, '--config', env.config);
    const approval = park.match(/vmgate approvals grant ([A-Z2-7]+)/)?.[1];
    assert.ok(approval, `vmgate undo parks an approval: ${park}`);
    assert.match(park, /taken \d{4}-\d\d-\d\d/, `vmgate undo says when the snapshot was taken: ${park}`);
    assert.match(park, /vm_agent_exec by grant alpha on /, `vmgate undo names the call: ${park}`);
    const shown = await vmgate('approvals', 'show', approval, '--config', env.config);
    const field = (name, value) => new RegExp(`^ +${name.replace(/\./g, '\\.')} \\([^)]*\\): ${value}$`, 'm');
    for (const want of [field('snapshot', snap), field('snapshot_taken', '\\d{4}-\\d\\d-\\d\\dT[0-9:.]+Z'), field('vm', vm1),
      field('call', callID), field('call.tool', 'vm_agent_exec'), field('call.grant', 'alpha'), field('call.time', '\\d{4}-.+Z'),
      field('call.args.shell', 'rm -rf /data/undo-e2e /tmp/undo-ram && sync')]) {
      assert.match(shown, want, `vmgate approvals show ${approval}`);
    }
    const records = await auditRecords();
    const outcome = records.find((r) => r.kind === 'outcome' && r.call_id === callID);
    assert.ok(outcome?.snapshot === snap && outcome.snapshot_id && outcome.snapshot_taken, `the outcome record keeps the snapshot's identity: ${JSON.stringify(outcome)}`);

    // The same name on the other VM, made on QEMU directly; that VM then moves on.
    await sh(beta, vm2, 'echo before > /tmp/twin-state && sync');
    await savevm(e.VMGATE_E2E_TWIN_QMP, snap);
    await sh(beta, vm2, 'echo after > /tmp/twin-state && sync');
    await writeFile(e.VMGATE_E2E_SHARED, JSON.stringify({ mark, snap, callID, approval }));
  } finally {
    await alpha.close();
    await beta.close();
  }
}

// phase2: after a restart, undo reverts the VM of the call, and refuses a replaced snapshot.
async function phase2() {
  const shared = JSON.parse(await readFile(e.VMGATE_E2E_SHARED, 'utf8'));
  const alpha = await connect(e.VMGATE_E2E_ALPHA_TOKEN, 'alpha');
  const beta = await connect(e.VMGATE_E2E_BETA_TOKEN, 'beta');
  try {
    await vmgate('approvals', 'grant', shared.approval, '--reason', 'e2e: undo alpha\'s rm -rf', '--config', env.config);
    const done = await tryVmgate('undo', shared.callID, '--config', env.config);
    assert.ok(done.ok && done.out.includes(`${vm1} reverted to snapshot ${shared.snap}`), `vmgate undo after the restart: ${done.out}`);
    let back;
    for (let i = 0; i < 60; i++) { // the agent channel comes back with the restored guest
      back = await call(alpha, 'vm_agent_exec', { vm: vm1, shell: 'cat /data/undo-e2e/mark /tmp/undo-ram; ls /data/undo-e2e', timeout_s: 60 });
      if (!back.isError) break;
      await new Promise((r) => setTimeout(r, 1000));
    }
    assert.equal(stdout(back), `${shared.mark}\nram\nmark\n`, `${vm1} as it was before the call, without beta's file: ${text(back)}`);
    assert.equal((await sh(beta, vm2, 'cat /tmp/twin-state')).trim(), 'after', `${vm2} was not reverted`);

    // A second undo snapshot, replaced behind vmgate's back by one holding a planted file.
    await sh(alpha, vm1, `mkdir -p /data/undo-e2e && echo second > /data/undo-e2e/mark && sync`);
    const res = await ok(alpha, 'vm_agent_exec', { vm: vm1, shell: 'rm -rf /data/undo-e2e && sync', timeout_s: 120 });
    const { undo_snapshot: snap2, undo_call: call2 } = res.structuredContent;
    assert.ok(snap2 && call2, `second undo snapshot: ${text(res)}`);
    await sh(beta, vm1, 'mkdir -p /data/undo-e2e && echo forged > /data/undo-e2e/planted && sync');
    await hmp(e.VMGATE_E2E_VM_QMP, `delvm ${snap2}`);
    await savevm(e.VMGATE_E2E_VM_QMP, snap2);
    await sh(beta, vm1, 'echo later > /tmp/after-forge && sync');
    const refused = await operatorUndo(call2);
    assert.equal(refused.ok, false, `vmgate undo of a replaced snapshot: ${refused.out}`);
    assert.match(refused.out, /was replaced since the call/, `it says why: ${refused.out}`);
    assert.match(refused.out, /nothing reverted/, `it says nothing was reverted: ${refused.out}`);
    assert.equal((await sh(alpha, vm1, 'cat /tmp/after-forge')).trim(), 'later', `${vm1} was not reverted to the forged snapshot`);
  } finally {
    await alpha.close();
    await beta.close();
  }
}

test(`phase ${phase}: ${phase === '1' ? 'beta cannot touch alpha\'s undo snapshot; the approval shows what it undoes'
  : 'after a restart, undo reverts the VM of the call only, and refuses a replaced snapshot'}`, { skip }, async () => {
  await (phase === '1' ? phase1() : phase2());
});
