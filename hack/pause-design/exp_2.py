"""Item 2 on QEMU 10: N clones restored from one snapshot RAM file mapped
share=off,readonly=on,rom=off (MAP_PRIVATE of a file opened read-only):
do they share its page cache, what does each own, does a clone's device
state then carry RAM, and does background-snapshot take a private mapping?
Usage: exp_2.py N"""
import sys, time, re; sys.path.insert(0, "."); from pd import *
n = int(sys.argv[1]); mem = 512
snap_ram, snap_dev = "/dev/shm/pd-2-snap.ram", "/dev/shm/pd-2-snap.dev"

def smaps(pid, path):
    out, cur = {}, False
    for l in open(f"/proc/{pid}/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", l): cur = l.rstrip().endswith(path)
        elif cur and l.split(":")[0] in ("Rss", "Pss", "Anonymous", "Shared_Clean", "Private_Dirty", "Private_Clean"):
            k = l.split(":")[0]; out[k] = out.get(k, 0) + int(l.split()[1]) // 1024
    return out
def pss_total(pid): return sum(int(l.split()[1]) for l in open(f"/proc/{pid}/smaps_rollup") if l.startswith("Pss:")) // 1024
def qemu_pid(vm):  # the qemu child of nice
    return int(subprocess.check_output(["pgrep", "-P", str(vm.p.pid)]).split()[0]) if subprocess.run(["pgrep", "-P", str(vm.p.pid)], capture_output=True).stdout else vm.p.pid

src = VM("2src", mem, "/dev/shm/pd-2-src.ram", memw="192,16,8", qemu=Q10, machine="pc-q35-7.2")
clones = []
try:
    src.wait_console("FILLED"); time.sleep(2)
    src.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    src.qmp("stop"); src.qmp("migrate", uri=f"exec:cat > {snap_dev}"); src.wait_migration()
    shutil.copyfile("/dev/shm/pd-2-src.ram", snap_ram); os.chmod(snap_ram, 0o444)
    print("snapshot: devstate", os.path.getsize(snap_dev) >> 10, "KiB", flush=True)
    src.close(); src = None; os.remove("/dev/shm/pd-2-src.ram")
    h0 = sha(snap_ram)
    for i in range(n):
        be = f"memory-backend-file,id=ram0,size={mem}M,mem-path={snap_ram},share=off,readonly=on,rom=off"
        vm = VM(f"2c{i}", mem, snap_ram, qemu=Q10, backend=be, incoming="defer", machine="pc-q35-7.2")
        vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
        vm.qmp("migrate-incoming", uri=f"exec:cat {snap_dev}")
        for _ in range(300):
            if vm.qmp("query-status")["status"] != "inmigrate": break
            time.sleep(0.1)
        c0 = vm.console_at(); vm.qmp("cont"); clones.append((vm, c0))
    time.sleep(6)
    tot = 0
    for i, (vm, c0) in enumerate(clones):
        pid = qemu_pid(vm); s = smaps(pid, snap_ram); p = pss_total(pid); tot += p
        print(f"clone {i}: running={len(vm.rates(c0)) > 0} ram mapping {s} qemu Pss {p} MiB", flush=True)
    print(f"{n} clones: summed QEMU Pss {tot} MiB; snapshot file unchanged: {sha(snap_ram) == h0}", flush=True)
    vm = clones[0][0]
    vm.qmp("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
    vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    t0 = time.time(); vm.qmp("stop"); vm.qmp("migrate", uri="exec:cat > /dev/shm/pd-2-ck.dev"); st = vm.wait_migration(); t1 = time.time(); vm.qmp("cont")
    print(f"clone checkpoint with x-ignore-shared: {st['status']} devstate {os.path.getsize('/dev/shm/pd-2-ck.dev') >> 20} MiB in {(t1-t0)*1e3:.0f} ms (stop..complete)", flush=True)
    vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": False}, {"capability": "background-snapshot", "state": True}])
    try:
        e0 = len(vm.events); vm.qmp("migrate", uri="exec:cat > /dev/shm/pd-2-bg.img"); st = vm.wait_migration()
        print(f"clone background-snapshot: {st['status']} {st.get('error-desc')} image {os.path.getsize('/dev/shm/pd-2-bg.img') >> 20} MiB downtime {st.get('downtime')} ms", flush=True)
    except Exception as e:
        print("clone background-snapshot refused:", e, flush=True)
finally:
    if src: src.close()
    for vm, _ in clones: vm.close()
    for f in [snap_ram, snap_dev, "/dev/shm/pd-2-ck.dev", "/dev/shm/pd-2-bg.img", "/dev/shm/pd-2-src.ram"]:
        if os.path.exists(f): os.remove(f)
