import csv, collections, sys
rows=list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    for k in r: r[k]=int(r[k])
by=collections.defaultdict(list)
for r in rows: by[(r['rows'],r['chunks'])].append(r)
launches=[]
for k,v in by.items():
    v.sort(key=lambda r:r['entry'])
    n=1 if k[0]==128256 else 32
    g=len(v)//n
    for i in range(n): launches.append((k, v[i*g:(i+1)*g]))
launches.sort(key=lambda l: min(r['entry'] for r in l[1]))
names={(6144,64):'qkv',(4096,64):'o',(28672,64):'gate|up',(4096,224):'down',(128256,64):'head'}
qi=[i for i,l in enumerate(launches) if names.get(l[0])=='qkv']
L=qi[int(sys.argv[2]) if len(sys.argv)>2 else 1]
base=min(r['entry'] for r in launches[L-1][1])
def q(vals):
    vals=sorted(vals); n=len(vals)
    return "%7.2f %7.2f %7.2f %7.2f %7.2f"%(vals[0]/1e3, vals[n//10]/1e3, vals[n//2]/1e3, vals[9*n//10]/1e3, vals[-1]/1e3)
print("us from the previous down's first block entry: min p10 median p90 max")
for l in launches[L-1:L+5]:
    name=names.get(l[0],str(l[0])); rs=l[1]
    print(f"{name:8s} blocks {len(rs)} prepared-units {sum(r['prepared'] for r in rs)}")
    for f in ['entry','waited','looped','end']:
        print(f"   {f:7s}", q([r[f]-base for r in rs]))
    print("   wait->loop", q([r['looped']-r['waited'] for r in rs]), " loop->end", q([r['end']-r['looped'] for r in rs]))
