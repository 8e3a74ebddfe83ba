"""Array conversion shared by the dsv41 package (docs/python.md, "Arrays").

Inputs may be numpy arrays, torch tensors or nested lists. torch bf16 tensors become float32
(exact: every bf16 value is a float32 value); other dtypes are kept, and the C++ side refuses a
dtype it does not take (a float64 is never rounded silently).
"""
import numpy as np


def to_numpy(x):
    """numpy array of x (torch tensors detached to the CPU; bf16 -> float32, exact)."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch  # only when a torch tensor is given

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.contiguous().numpy()
    if isinstance(x, tuple):  # (dtype name, shape, bytes): a stored checkpoint tensor
        return x
    return np.asarray(x)


def to_numpy_dict(d):
    return {str(k): to_numpy(v) for k, v in (d or {}).items()}
