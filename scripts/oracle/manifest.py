# sha256 of every dataset of every .h5 and of every tensor of weights.safetensors in a folder -> JSON on stdout.
import hashlib, json, os, struct, sys
import h5py, numpy as np
d = sys.argv[1]
out = {}
for fn in sorted(os.listdir(d)):
    p = os.path.join(d, fn)
    if fn.endswith('.h5'):
        m = {}
        with h5py.File(p, 'r') as f:
            def v(name, obj):
                if isinstance(obj, h5py.Dataset):
                    a = np.ascontiguousarray(obj[()])
                    m[name] = [str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()[:24]]
            f.visititems(v)
        out[fn] = m
    elif fn.endswith('.safetensors'):
        with open(p, 'rb') as f:
            n = struct.unpack('<Q', f.read(8))[0]
            hdr = json.loads(f.read(n)); data = f.read()
        out[fn] = {k: [v['dtype'], v['shape'], hashlib.sha256(data[v['data_offsets'][0]:v['data_offsets'][1]]).hexdigest()[:24]]
                   for k, v in hdr.items() if k != '__metadata__'}
json.dump(out, sys.stdout, indent=0, sort_keys=True)
