// Eyes and hands without the guest agent (issue 31): vm_screenshot,
// vm_send_keys, vm_console_read and vm_console_write with the official
// MCP SDK over stdio against the lab VM (screen_test.go sets it up).
// Grant "screen" may use them freely; grant "builtin" has the built-in
// policy, which sends keys to an operator.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { env, missingEnv, TAGS, call, ok, text, assertTag, connectStdio, vmgate } from './lib.mjs';

const deadline = (ms) => Date.now() + ms;

// ocr runs the Go test binary as tesseract's front end (screen_test.go).
function ocr(png) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.env.VMGATE_E2E_OCR, [], { env: { ...process.env, VMGATE_E2E_OCR_HELPER: '1' } });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('error', reject);
    p.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`ocr exited ${code}: ${err}`))));
    p.stdin.end(png);
  });
}

// ocrFound: some stretch of a line (spaces left out) within an edit
// distance of two of token (a letter changed, added or dropped), as
// hypervisortest's OCR checks allow (Sellers' algorithm).
function ocrFound(seen, token) {
  for (let line of seen.toLowerCase().split('\n')) {
    line = line.replaceAll(' ', '');
    let prev = new Array(line.length + 1).fill(0);
    for (let i = 1; i <= token.length; i++) {
      const cur = [i];
      for (let j = 1; j <= line.length; j++) {
        cur[j] = Math.min(prev[j - 1] + (token[i - 1] === line[j - 1] ? 0 : 1), prev[j] + 1, cur[j - 1] + 1);
      }
      prev = cur;
    }
    if (Math.min(...prev) <= 2) return true;
  }
  return false;
}

// ocrToken: letters OCR does not confuse on a VGA console (none of i l o,
// nor g q y u v w m n, which it reads as one another or splits).
function ocrToken() {
  const letters = 'abcdefhjkprstxz';
  return 'vmgate' + [...randomBytes(7)].map((b) => letters[b % letters.length]).join('');
}

// screenShows takes screenshots until OCR reads token on one.
async function screenShows(client, token) {
  let last = '';
  for (const end = deadline(180_000); Date.now() < end;) {
    const res = await ok(client, 'vm_screenshot', { vm: env.vm });
    const img = res.content.find((c) => c.type === 'image');
    assert.equal(img?.mimeType, 'image/png', 'vm_screenshot carries an image/png');
    const png = Buffer.from(img.data, 'base64');
    assert.equal(png.subarray(1, 4).toString(), 'PNG', 'the image is a PNG');
    assert.equal(res.structuredContent.bytes, png.length, 'structuredContent.bytes');
    assert.ok(res.structuredContent.width >= 320 && res.structuredContent.height >= 200, `screen ${res.structuredContent.width}x${res.structuredContent.height}`);
    last = await ocr(png);
    if (ocrFound(last, token)) return;
    await new Promise((r) => setTimeout(r, 2000));
  }
  assert.fail(`OCR never read ${token} on the screen; last read:\n${last}`);
}

// consoleUntil reads the console from since until want appears; returns
// the cursor after it.
async function consoleUntil(client, since, want) {
  let seen = '';
  for (const end = deadline(120_000); Date.now() < end;) {
    const res = await ok(client, 'vm_console_read', { vm: env.vm, since, max_bytes: 1 << 20 });
    const sc = res.structuredContent;
    assert.equal(sc.cursor, sc.start + sc.bytes, 'cursor = start + bytes');
    seen += sc.data ?? '';
    since = sc.cursor;
    if (seen.includes(want)) return since;
    if (!sc.more) await new Promise((r) => setTimeout(r, 1000));
  }
  assert.fail(`vm_console_read never showed ${JSON.stringify(want)}; read ${seen.length} bytes ending ${JSON.stringify(seen.slice(-400))}`);
}

async function agentConnected(client, want) {
  for (const end = deadline(120_000); Date.now() < end;) {
    const res = await ok(client, 'vm_status', { vm: env.vm });
    if (res.structuredContent.agent_connected === want) return;
    await new Promise((r) => setTimeout(r, 1000));
  }
  assert.fail(`vm_status never said agent_connected ${want}`);
}

test('the screen, keys and serial console, with and without the guest agent', { skip: missingEnv }, async (t) => {
  const client = await connectStdio('screen', 'vmgate-e2e-screen');
  try {
    await t.test('annotations tell the truth', async () => {
      const { tools } = await client.listTools();
      const by = Object.fromEntries(tools.map((x) => [x.name, x.annotations ?? {}]));
      for (const name of ['vm_screenshot', 'vm_console_read']) {
        assert.equal(by[name].readOnlyHint, true, `${name}.readOnlyHint`);
      }
      for (const name of ['vm_send_keys', 'vm_console_write']) {
        assert.equal(by[name].readOnlyHint, false, `${name}.readOnlyHint`);
        assert.equal(by[name].destructiveHint, true, `${name}.destructiveHint`);
        assert.equal(by[name].openWorldHint, true, `${name}.openWorldHint`);
      }
    });

    await t.test('vm_console_read shows the boot', async () => {
      await consoleUntil(client, 0, 'Linux version');
    });

    await t.test('a bad key name presses nothing', async () => {
      assertTag(await call(client, 'vm_send_keys', { vm: env.vm, keys: ['ctrl-alt-nope'] }), TAGS.invalid, 'unknown key');
      assertTag(await call(client, 'vm_send_keys', { vm: env.vm, text: 'echo \u001b[2J' }), TAGS.invalid, 'an escape in text');
    });

    // Stop the agent (SIGSTOP a second after the exec returns).
    await ok(client, 'vm_agent_exec', { vm: env.vm, shell: '(sleep 1; kill -STOP $(pidof qemu-ga)) </dev/null >/dev/null 2>&1 &' });
    await agentConnected(client, false);

    await t.test('without the agent: typed text read back from the screen', async () => {
      const token = ocrToken();
      const res = await ok(client, 'vm_send_keys', { vm: env.vm, text: `echo ${token}\n` });
      assert.equal(res.structuredContent.presses, `echo ${token}\n`.length);
      await screenShows(client, token);
    });

    await t.test('without the agent: a command on the serial shell answers in the next read', async () => {
      const tail = await ok(client, 'vm_console_read', { vm: env.vm, tail_bytes: 1 });
      const word = randomBytes(6).toString('hex');
      await ok(client, 'vm_console_write', { vm: env.vm, text: `echo $((6*7))-${word}\n` });
      await consoleUntil(client, tail.structuredContent.cursor, `42-${word}`);
    });

    await t.test('without the agent: keys combinations still go', async () => {
      await ok(client, 'vm_send_keys', { vm: env.vm, keys: ['ctrl-l'] });
    });

    // Continue the agent through the console.
    await ok(client, 'vm_console_write', { vm: env.vm, text: 'kill -CONT $(pidof qemu-ga)\n' });
    await agentConnected(client, true);
  } finally {
    await client.close();
  }
});

test('typed text waits for an operator, who sees it in full; the audit log keeps its digest', { skip: missingEnv }, async () => {
  const client = await connectStdio('builtin', 'vmgate-e2e-screen-gated');
  try {
    const token = ocrToken();
    const args = { vm: env.vm, text: `echo ${token}\n` };
    const parked = await call(client, 'vm_send_keys', args);
    assertTag(parked, TAGS.approval, 'vm_send_keys under the built-in policy');
    const id = parked.structuredContent.approval_id;
    const shown = await vmgate('approvals', 'show', id, '--config', env.config);
    assert.ok(shown.includes(`echo ${token}`), `vmgate approvals show ${id} shows the text:\n${shown}`);
    await vmgate('approvals', 'grant', id, '--reason', 'e2e screen', '--config', env.config);
    const res = await ok(client, 'vm_send_keys', args);
    assert.equal(res.structuredContent.presses, args.text.length);
    const log = await vmgate('audit', 'search', `${env.state}/audit.log`, '--tool', 'vm_send_keys', '-o', 'json');
    assert.ok(!log.includes(token), 'the audit log holds the typed text in clear');
    assert.ok(log.includes('sha256:'), `the audit log holds the text's digest:\n${log}`);
  } finally {
    await client.close();
  }
});
