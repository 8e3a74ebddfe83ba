# Bundle run outputs for the trip back: plain tars (h5 data is already gzip'd), each <= 15.9 MiB,
# at most MAXF files and 63 MiB in all; items in priority order; what does not fit is listed in left.txt.
import os, sys, tarfile
W, OUT = sys.argv[1], sys.argv[2]
MAXF, LIMIT, TOTAL = 8, int(15.9 * 2**20), int(63 * 2**20)
prio = [l.split() for l in open(sys.argv[3]) if l.strip() and not l.startswith('#')]  # lines: relpath
items = [(p[0], os.path.getsize(os.path.join(W, p[0]))) for p in prio if os.path.exists(os.path.join(W, p[0]))]
bundles, left, total = [], [], 0
for rel, sz in items:
    if sz > LIMIT or total + sz > TOTAL:
        left.append(rel); continue
    for b in bundles:
        if b[1] + sz <= LIMIT:
            b[0].append(rel); b[1] += sz; break
    else:
        if len(bundles) >= MAXF:
            left.append(rel); continue
        bundles.append([[rel], sz])
    total += sz
for i, (files, sz) in enumerate(bundles):
    with tarfile.open(os.path.join(OUT, 'b%d.tar' % i), 'w') as t:
        for rel in files:
            t.add(os.path.join(W, rel), arcname=rel)
with open(os.path.join(W, 'left.txt'), 'w') as f:
    f.write('\n'.join(left) + '\n')
print('bundles', [(len(f), s) for f, s in bundles], 'total', total, 'left', left)
