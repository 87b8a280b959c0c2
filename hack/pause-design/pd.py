#!/usr/bin/env python3
"""Throwaway harness for docs/design/constant-time-pause.md: boots a tiny
guest (busybox + memw) in QEMU under TCG with its RAM a shared
memory-backend-file, and measures pause candidates over QMP. Not part of
cryo; run as root under `flock /tmp/cryo-it.lock nice -n 10`."""
import json, os, socket, subprocess, threading, time, hashlib, queue, sys, shutil, statistics

Q7 = ["qemu-system-x86_64"]
Q10 = ["/var/cache/cryo/qemu10/usr/bin/qemu-system-x86_64", "-L", "/var/cache/cryo/qemu10/usr/share/qemu", "-L", "/usr/share/seabios"]
KERNEL = "/work/wt/pause-design/_output/guest/vmlinuz"
INITRD = "/tmp/pd-initrd.img"

class VM:
    def __init__(self, name, mem_mib, ram, memw=None, qemu=Q7, backend=None, incoming=None, machine="q35", smp=1):
        self.dir = f"/tmp/pd-{name}"
        shutil.rmtree(self.dir, ignore_errors=True); os.makedirs(self.dir)
        self.ram, self.console = ram, f"{self.dir}/console"
        be = backend or f"memory-backend-file,id=ram0,size={mem_mib}M,mem-path={ram},share=on"
        app = "console=ttyS0 quiet panic=-1" + (f" memw={memw}" if memw else "")
        args = ["nice", "-n", "10"] + qemu + ["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-machine", f"{machine},memory-backend=ram0", "-accel", "tcg", "-cpu", "qemu64", "-smp", str(smp),
            "-m", f"{mem_mib}M", "-object", be, "-kernel", KERNEL, "-initrd", INITRD, "-append", app,
            "-serial", f"file:{self.console}", "-qmp", f"unix:{self.dir}/qmp,server=on,wait=off"]
        if incoming:
            args += ["-S", "-incoming", incoming]
        self.p = subprocess.Popen(args, stdout=open(f"{self.dir}/out", "w"), stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(f"{self.dir}/qmp"): break
            if self.p.poll() is not None: raise RuntimeError(open(f"{self.dir}/out").read())
            time.sleep(0.05)
        self.s = socket.socket(socket.AF_UNIX); self.s.connect(f"{self.dir}/qmp")
        self.f = self.s.makefile("r"); self.f.readline()
        self.resp, self.events = queue.Queue(), []
        threading.Thread(target=self._read, daemon=True).start()
        self.qmp("qmp_capabilities")

    def _read(self):
        try:
            lines = list_lines(self.f)
            for line in lines:
                self._one(line)
        except (ConnectionError, ValueError, OSError):
            pass

    def _one(self, line):
            m = json.loads(line)
            if "event" in m:
                m["host"] = time.time(); self.events.append(m)
            else:
                self.resp.put(m)

    def qmp(self, cmd, **args):
        self.s.sendall(json.dumps({"execute": cmd, "arguments": args}).encode() + b"\n")
        r = self.resp.get(timeout=120)
        if "error" in r: raise RuntimeError(f"{cmd}: {r['error']}")
        return r["return"]

    def wait_console(self, word, timeout=600):
        t = time.time()
        while time.time() - t < timeout:
            if os.path.exists(self.console) and word in open(self.console, errors="replace").read(): return
            if self.p.poll() is not None: raise RuntimeError("qemu died: " + open(f"{self.dir}/out").read())
            time.sleep(0.2)
        raise TimeoutError(word)

    def console_at(self): return os.path.getsize(self.console)

    def rates(self, a, b=None):
        d = open(self.console, "rb").read()[a:b].decode(errors="replace")
        return [float(l.split()[2]) for l in d.splitlines() if l.startswith("R ") and len(l.split()) == 3]

    def wait_migration(self, poll=0.005, timeout=600):
        t = time.time()
        while time.time() - t < timeout:
            st = self.qmp("query-migrate")
            if st.get("status") in ("completed", "failed", "cancelled"): return st
            time.sleep(poll)
        raise TimeoutError("migration")

    def close(self):
        try: self.qmp("quit")
        except Exception: pass
        try: self.p.wait(10)
        except Exception: self.p.kill(); self.p.wait()

def list_lines(f):
    for line in f:
        yield line

def sha(path, size=None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        n = 0
        while True:
            b = f.read(1 << 20)
            if not b: break
            h.update(b); n += len(b)
    return h.hexdigest()

def ev_ts(e): return e["timestamp"]["seconds"] + e["timestamp"]["microseconds"] / 1e6
