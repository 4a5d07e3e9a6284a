"""Where the host time of a version's call goes, at 16 x 256 x 256 (V3, its representative
configuration, no tuning): torch.matmul, torch.empty alone, the compiled program's launch function
alone, tilus's Script.__call__, the Python plan (SeriesPlan.__call__), and matmul() through the
native entry's launch route. Best of two passes (both orders) of harness.model.host_us. Prints
one JSON line (launch_probe.txt); MATMUL_NATIVE_ENTRY=0 runs it without the native entry.

    source .gpu/env.sh && python plots/h100/model/launch_probe.py
"""

import json

import torch

# whether this torch converts tensors for tvm_ffi (tilus's launches) by its own C exchange API, before tilus loads
before = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
import matmul  # noqa: E402
from matmul.call import api, tilus_autotune  # noqa: E402
from matmul.call.launch import SeriesPlan  # noqa: E402
from matmul.contract import check_call  # noqa: E402
from matmul.harness.model import host_us  # noqa: E402
from matmul.kernels import versions  # noqa: E402

x = torch.rand(16, 256, device="cuda").half()
w = torch.rand(256, 256, device="cuda").half()
module = versions.load("sm_90a", "v3")
script = versions.kernel(module, torch.float16, module.REPRESENTATIVE)
bt, copied, c = check_call(x, w.T)
args = versions.launch_args(x, bt, c)
script(*args)
fn = tilus_autotune.launch_function(script)
plan = SeriesPlan(fn, x, w.T, bt, copied, c, None)
plan(x, w.T, None)
buf = torch.empty(16, 256, device="cuda").half()
ap, bp = x.data_ptr(), w.data_ptr()
api._plans.keep(plan, x, w.T)
fns = {
    "torch.matmul": lambda: torch.matmul(x, w.T),
    "torch.empty": lambda: torch.empty((16, 256), dtype=torch.float16, device=x.device),
    "launch fn": lambda: fn(16, 256, 256, ap, bp, buf, 256, 256, 256),
    "Script.__call__": lambda: script(*args),
    "plan": lambda: plan(x, w.T, None),
    "matmul()": lambda: matmul.matmul(x, w.T),
}
res = {}
for r in range(2):
    for name, f in fns.items() if r == 0 else reversed(fns.items()):
        res[name] = min(res.get(name, 1e9), host_us(f))
print(
    json.dumps(
        {
            "native": api._native is not None,
            "dlpack_api_before": before,
            "dlpack_api_after": hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
            **{k: round(v, 2) for k, v in res.items()},
        }
    ),
    flush=True,
)
