"""The network benchmark's throughput cases: iperf3 between the host, the
internet namespace and a sandbox.
"""

from __future__ import annotations

import json
import subprocess
import time

import forkvm_bench as fb
from network_host import IPERF_PORT, Internet
from network_forks import guest_sh


def iperf_figures(out: str, what: str) -> dict:
    try:
        v = json.loads(out)
    except ValueError:
        raise fb.BenchError(f"{what}: iperf3 gave no JSON: {out[-2000:]}") from None
    if v.get("error"):
        raise fb.BenchError(f"{what}: iperf3: {v['error']}")
    end = v.get("end") or {}
    rec = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    if not rec.get("bits_per_second"):
        raise fb.BenchError(f"{what}: no sum_received in the iperf3 result")
    return {"mbit_s": rec["bits_per_second"] / 1e6, "bytes": rec.get("bytes"),
            "seconds": rec.get("seconds"), "retransmits": sent.get("retransmits")}


def iperf_host(argv: list[str], secs: int, what: str, tries: int = 3) -> dict:
    last = ""
    for _ in range(tries):
        r = subprocess.run(["iperf3", *argv, "-t", str(secs), "-J"], capture_output=True,
                           text=True, timeout=secs + 90)
        try:
            return iperf_figures(r.stdout, what)
        except fb.BenchError as e:
            last = str(e)
            time.sleep(1)
    raise fb.BenchError(last)


def iperf_guest(d: fb.Daemon, sid: str, addr: str, secs: int) -> dict:
    r = d.api.exec(sid, ["iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", str(secs), "-J"],
                   timeout_ms=(secs + 90) * 1000)
    if r.get("exit_code") != 0 and not r.get("stdout"):
        raise fb.BenchError(f"iperf3 in the guest exited {r.get('exit_code')}: {r.get('stderr')}")
    return iperf_figures(r.get("stdout", ""), "guest iperf3 client")


IPERF_CASES = [
    # series, direction, description
    ("vm_to_inet", "guest → internet netns",
     "guest `iperf3 -c <internet> -t T -J` (exec); path: virtio-net, tap0, the sandbox "
     "namespace's masquerade, veth, the host's masquerade, the internet veth"),
    ("host_to_vm_relay", "host → guest via port relay",
     "host `iperf3 -c 127.0.0.1 -p <published port> -t T -J`, `iperf3 -s` in the guest; path: "
     "the daemon's TCP relay on 127.0.0.1, the uplink, DNAT in the sandbox namespace, tap0"),
    ("vm_to_host_relay", "guest → host via port relay (-R)",
     "the same with `-R` (the guest sends)"),
    ("ceiling_host_to_inet", "host → internet netns (no VM)",
     "host `iperf3 -c <internet> -t T -J` against the internet namespace's server"),
    ("ceiling_inet_to_host", "internet netns → host (no VM, -R)",
     "the same with `-R`"),
]


def run_iperf(d: fb.Daemon, inet: Internet, args, rows: list[dict], meter) -> None:
    secs = args.iperf_time
    sb = d.create(memory_mib=args.memory, cpus=1, ports=[{"guest": IPERF_PORT, "host": 0}])
    sid = sb["id"]
    ports = ((sb.get("network") or {}).get("ports")) or []
    hp = next((p["host"] for p in ports if p["guest"] == IPERF_PORT), None)
    if not hp:
        raise fb.BenchError(f"the iperf3 sandbox has no published port 5201: {sb}")
    print(f"[iperf3] sandbox {sid}, guest port {IPERF_PORT} on 127.0.0.1:{hp}; "
          f"{args.iperf_runs} × {secs} s per direction", flush=True)
    guest_sh(d, sid, "setsid iperf3 -s -p 5201 >/dev/null 2>&1 </dev/null &")
    time.sleep(1)
    try:
        for run in range(1, args.iperf_runs + 1):
            for series, direction, _ in IPERF_CASES:
                meter.start()
                if series == "vm_to_inet":
                    f = iperf_guest(d, sid, inet.addr, secs)
                elif series == "host_to_vm_relay":
                    f = iperf_host(["-c", "127.0.0.1", "-p", str(hp)], secs, series)
                elif series == "vm_to_host_relay":
                    f = iperf_host(["-c", "127.0.0.1", "-p", str(hp), "-R"], secs, series)
                elif series == "ceiling_host_to_inet":
                    f = iperf_host(["-c", inet.addr, "-p", str(IPERF_PORT)], secs, series)
                else:
                    f = iperf_host(["-c", inet.addr, "-p", str(IPERF_PORT), "-R"], secs, series)
                row = {"kind": "iperf", "series": series, "run": run, "direction": direction,
                       "child": sid if not series.startswith("ceiling") else "",
                       **f, "other_cpu_cores": meter.other_cores()}
                rows.append(row)
                print(f"[iperf3 {run}/{args.iperf_runs}] {direction:38s} "
                      f"{f['mbit_s']:9,.1f} Mbit/s  (retransmits {f.get('retransmits')}, "
                      f"others {row['other_cpu_cores']:.2f} cores)", flush=True)
    finally:
        d.delete(sid)
