"""A/B: naive restore cont->agent pong with tb-size=64 vs QEMU default, THP on vs off."""
import copy, os, shutil, sys, tempfile, time, statistics, types
sys.path.insert(0, "/work/main/bench/common"); sys.path.insert(0, "/work/main/bench/spawn")
import forkvm_bench as fb, naive as nv, bench_spawn as bs
N = int(sys.argv[1]) if len(sys.argv) > 1 else 12
args = types.SimpleNamespace(memory=512, settle=2.0)
THP_WRAP = [sys.executable, "-c",
  "import ctypes,os,sys; assert ctypes.CDLL(None).prctl(41,1,0,0,0)==0; os.execvp(sys.argv[1], sys.argv[1:])"]
def variant(saved, tb, thp_off):
    s = copy.copy(saved); argv = list(saved.argv)
    i = argv.index("-accel"); acc = argv[i+1]
    if not tb: acc = ",".join(p for p in acc.split(",") if not p.startswith("tb-size"))
    argv[i+1] = acc
    if thp_off: argv = THP_WRAP + argv
    s.argv = argv; return s
fb.wait_for_quiet_host(120)
shm = tempfile.mkdtemp(prefix="ab-", dir="/dev/shm")
res = {}
with fb.Daemon(env={"FORKVM_NO_JAIL": "1"}) as d:
    src, snap, _ = bs.make_source(d, args, "ab")
    work = os.path.join(d.home, "naive"); os.mkdir(work)
    saved = nv.naive_save(d, src["id"], src["pid"], 512, work)
    print("accel:", saved.argv[saved.argv.index("-accel")+1])
    vs = {"tb64_thp": (True, False), "tbdef_thp": (False, False), "tb64_nothp": (True, True), "tbdef_nothp": (False, True)}
    k = 0
    for r in range(N):
        order = list(vs) if r % 2 == 0 else list(reversed(vs))
        for name in order:
            k += 1
            vm = nv.naive_restore(variant(saved, *vs[name]), os.path.join(work, f"r{k}"), os.path.join(shm, f"r{k}.mem"), f"ab{k}")
            try:
                t = vm.timings
                res.setdefault(name, []).append(t)
                print(f"{r} {name:12s} total {t['total_ms']:.0f} load {t['load_ms']:.0f} cont {t['cont_ms']:.0f} agent {t['agent_ms']:.0f}", flush=True)
            finally:
                vm.stop()
            shutil.rmtree(os.path.join(work, f"r{k}"), ignore_errors=True)
            try: os.unlink(os.path.join(shm, f"r{k}.mem"))
            except OSError: pass
shutil.rmtree(shm, ignore_errors=True)
for name, rows in res.items():
    for key in ("total_ms", "load_ms", "agent_ms"):
        xs = sorted(x[key] for x in rows)
        print(f"{name:12s} {key:9s} p50 {statistics.median(xs):7.1f}  p90 {xs[int(0.9*(len(xs)-1))]:7.1f}")
