"""Pool the runs of this A/B by binary and print p50 / p90 per series.

Usage: python3 pool.py */network.csv   (run directories are named N-before or N-after)
"""
import csv, sys, statistics as st
groups={}
for f in sys.argv[1:]:
    b=f.split('/')[-2].split('-')[1]
    for r in csv.DictReader(open(f)):
        if r['kind']=='egress': groups.setdefault(b,[]).append(r)
def q(v,p):
    v=sorted(v); 
    import math
    k=(len(v)-1)*p; lo=math.floor(k); hi=math.ceil(k)
    return v[lo]+(v[hi]-v[lo])*(k-lo)
keys=['request_to_egress_ms','resume_to_egress_ms','pause_ms','snapshot_ms','snapshot_publish_ms','prepare_ms','qemu_start_ms','identity_ms','network_ready_ms','guest_connect_ms','spawn_ms','memory_diff_bytes']
for s in ['diff','diff_nowait','naive']:
    print('##',s)
    for k in keys+['probe_part']:
        out=[]
        for b in sorted(groups, key=lambda b: b != 'before'):
            rows=[r for r in groups[b] if r['series']==s]
            if k=='probe_part':
                v=[float(r['network_ready_ms'])-float(r['identity_ms']) for r in rows if r.get('network_ready_ms')]
            else:
                v=[float(r[k]) for r in rows if r.get(k) not in (None,'')]
            out.append(f"{q(v,.5):8.1f} / {q(v,.9):8.1f} (n={len(v)})" if v else '-')
        print(f"{k:24s} " + "  ".join(f"{b} {o:28s}" for b, o in zip(sorted(groups, key=lambda b: b != 'before'), out)))
