#!/usr/bin/env python3
"""Boots a kept test-host initramfs again and again (the harness's QEMU command plus a monitor
socket); after SILENCE seconds without console output it asks the monitor for the registers
(six samples, 2 s apart), the LAPIC, the PIC, the CPUs and the IRQ counts, saves them as
OUT/hangN.txt and starts the next boot. How the test host's freeze of 2026-12-05 was found
(docs/testing.md, "The test host froze").

usage: boot-loop.py L1_CPIO TAG RUNS [SILENCE]   (env: SMP=1|2, ACCEL=tcg|tcg,thread=multi,
       KERNEL=the test host's vmlinuz, QEMU=the qemu-system-x86_64 to run, QEMU_ARGS=more
       arguments (e.g. "-L DIR" for another build's firmware), APPEND=more test-host kernel
       parameters; output in ./TAG/)
A failed test-host run keeps its initramfs: "[testhost] kept /tmp/microvirt-testhost-PID".
"""
import os, socket, subprocess, sys, time, threading, queue
import glob
KERNEL = os.environ.get('KERNEL') or sorted(glob.glob(os.path.expanduser('~/.cache/microvirt/testhost/*/root/boot/vmlinuz-*')))[-1]
CPIO = sys.argv[1]; tag = sys.argv[2]; n = int(sys.argv[3]); silence = int(sys.argv[4]) if len(sys.argv) > 4 else 150
out = os.path.abspath(tag)
os.makedirs(out, exist_ok=True)

def mon(path, cmds):
    s = socket.socket(socket.AF_UNIX); s.connect(path); s.settimeout(10)
    buf = b''
    def until_prompt():
        nonlocal buf
        while b'(qemu) ' not in buf:
            d = s.recv(65536)
            if not d: break
            buf += d
        r, _, buf = buf.partition(b'(qemu) ')
        return r.decode(errors='replace')
    until_prompt()
    res = []
    for c in cmds:
        if c.startswith('sleep '):
            time.sleep(float(c.split()[1])); continue
        s.sendall((c + '\n').encode())
        res.append(f'--- {c}\n' + until_prompt())
    s.close()
    return '\n'.join(res)

for i in range(n):
    sock = f'{out}/mon{i}.sock'
    log = open(f'{out}/run{i}.log', 'w')
    p = subprocess.Popen([os.environ.get('QEMU', 'qemu-system-x86_64')] + os.environ.get('QEMU_ARGS', '').split() + ['-accel', os.environ.get('ACCEL', 'tcg,thread=multi'), '-cpu', 'max', '-smp', os.environ.get('SMP', '2'), '-m', '2G',
        '-nographic', '-no-reboot', '-nodefaults', '-serial', 'stdio', '-monitor', f'unix:{sock},server=on,wait=off',
        '-net', 'none', '-kernel', KERNEL, '-initrd', CPIO, '-append', ('console=ttyS0 panic=-1 quiet nokaslr ' + os.environ.get('APPEND', '')).strip()],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    q = queue.Queue()
    threading.Thread(target=lambda: [q.put(l) for l in p.stdout] and q.put(None), daemon=True).start()
    t0 = time.time(); last = t0; verdict = None
    while True:
        try:
            l = q.get(timeout=5)
        except queue.Empty:
            if time.time() - last > silence:
                verdict = 'HANG'
                cmds = []
                for k in range(6):
                    cmds += ['info registers -a', 'sleep 2']
                cmds += ['info lapic', 'info pic', 'info cpus', 'info irq']
                try:
                    d = mon(sock, cmds)
                except Exception as e:
                    d = f'monitor failed: {e}'
                open(f'{out}/hang{i}.txt', 'w').write(d)
                break
            if time.time() - t0 > 1500:
                verdict = 'TIMEOUT'; break
            continue
        if l is None:
            verdict = verdict or 'EXIT'; break
        s = l.decode(errors='replace').rstrip()
        last = time.time()
        log.write(f'[{last - t0:8.2f}] {s}\n'); log.flush()
        if 'microvirt-testhost done' in s:
            verdict = 'DONE'
    p.kill(); p.wait()
    print(f'{tag} run {i}: {verdict} {time.time() - t0:.0f}s', flush=True)
