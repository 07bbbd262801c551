// End-to-end of VMs on demand over stdio with the official SDK: an agent
// creates two VMs from the lab template, runs a command in each, is
// refused a third by the quota, deletes one and lets the other's lease run
// out. The Go test lifecycle_test.go writes the config (template "lab",
// quota of 2 VMs per grant) and checks afterwards that nothing is left on
// the host.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { env, TAGS, call, ok, text, assertTag, connectStdio, scaled } from './lib.mjs';

const template = process.env.VMGATE_E2E_TEMPLATE;
// backend is the backend of the template (lab: the QEMU lab; virt: libvirt);
// hostnames says each created VM's hostname is its name (the QEMU lab's
// guests; a libvirt clone keeps its template's kernel command line).
const backend = process.env.VMGATE_E2E_BACKEND ?? 'lab';
const hostnames = process.env.VMGATE_E2E_HOSTNAMES === '1';
const skip = !env.bin || !env.config || !template
  ? 'run through `go test ./e2e -run TestNodeSDKLifecycle` (it writes the config and sets VMGATE_E2E_TEMPLATE)'
  : false;
const createTimeout = 360_000; // a TCG guest on a loaded machine boots slowly

async function create(client, args) {
  const res = await call(client, 'vm_create', { template, ...args }, createTimeout);
  assert.equal(res.isError ?? false, false, `vm_create(${JSON.stringify(args)}) = ${text(res)}; want success`);
  return res.structuredContent;
}

async function created(client) {
  const res = await ok(client, 'list_vms', {});
  return res.structuredContent.vms.filter((v) => v.created);
}

test('vm_create, exec, quota, vm_delete, lease end', { skip, timeout: scaled(15 * 60_000) }, async () => {
  const client = await connectStdio('local', 'vmgate-e2e-lifecycle');
  try {
    const { tools } = await client.listTools();
    for (const name of ['vm_create', 'vm_delete']) {
      const t = tools.find((x) => x.name === name);
      assert.ok(t, `tools/list has ${name}`);
      assert.equal(t.annotations.destructiveHint, true, `${name} is destructive`);
    }

    const a = await create(client, { name: 'keep', ttl_s: 3600 });
    const b = await create(client, { name: 'short', ttl_s: 30 });
    assert.equal(a.vm, `${backend}/${template}-keep`);
    assert.equal(b.vm, `${backend}/${template}-short`);
    assert.equal(b.ttl_s, 30);

    for (const vm of [a.vm, b.vm]) {
      const res = await ok(client, 'vm_agent_exec', { vm, command: ['cat', '/proc/sys/kernel/hostname'] });
      assert.equal(res.structuredContent.exit_code, 0, `exec in ${vm}`);
      assert.ok(res.structuredContent.stdout.trim().length > 0, `exec in ${vm} printed its hostname`);
      if (hostnames) {
        assert.equal(res.structuredContent.stdout.trim(), vm.slice(`${backend}/`.length), `${vm} runs its own guest`);
      }
    }

    const third = await call(client, 'vm_create', { template, name: 'third' }, createTimeout);
    assertTag(third, '[QUOTA EXCEEDED]', 'a third VM over a quota of 2');
    assert.match(text(third), /quota vms_per_grant is full: 2 of 2/);

    let list = await created(client);
    assert.deepEqual(list.map((v) => v.id).sort(), [a.vm, b.vm].sort(), 'list_vms marks both created VMs');
    for (const v of list) {
      assert.equal(v.created.created_by, 'local');
      assert.ok(Date.parse(v.created.lease_ends) > Date.now() - 60_000, `${v.id} lease_ends ${v.created.lease_ends}`);
    }

    const other = await call(client, 'vm_delete', { vm: env.vm });
    assertTag(other, TAGS.invalid, 'vm_delete of a VM vm_create did not make');
    assert.match(text(other), /was not created by vm_create/);

    const del = await ok(client, 'vm_delete', { vm: a.vm });
    assert.equal(del.structuredContent.deleted, true);
    const gone = await call(client, 'vm_agent_exec', { vm: a.vm, command: ['true'] });
    assert.equal(gone.isError, true, `exec in a deleted VM = ${text(gone)}`);

    // b's lease runs out: the reaper deletes it (it runs every few seconds).
    for (;;) {
      list = await created(client);
      if (list.length === 0) break;
      assert.deepEqual(list.map((v) => v.id), [b.vm], 'only b is left until its lease ends');
      await new Promise((r) => setTimeout(r, 1000)); // polling list_vms for the condition
    }
    const after = await ok(client, 'list_vms', {});
    assert.ok(!after.structuredContent.vms.some((v) => v.id === b.vm), `${b.vm} is gone from list_vms`);
  } finally {
    await client.close();
  }
});
