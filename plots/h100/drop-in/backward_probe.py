"""Which launch of linear's backward faults (one process per step: a fault leaves the CUDA context
unusable). Run on the GPU with CUDA_LAUNCH_BLOCKING=1:  python plots/h100/drop-in/backward_probe.py"""

import subprocess
import sys

STEP = r"""
import sys, torch, matmul
from matmul.call import api
from matmul.call.launch import Plans
from matmul.contract import check_call
from matmul.kernels import versions
from matmul.kernels.variant import PLAIN

class Fixed:
    def __init__(self, version): self.version = version
    def on_change(self, callback): pass
    def get(self, device, dtype, m, n, k, variant=PLAIN):
        module = versions.load("sm_90a", self.version)
        return "sm_90a", {"version": self.version, "config": dict(module.REPRESENTATIVE)}

version, step, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
api.use_plans(Plans(Fixed(version), check=check_call))
x = torch.randn(m, 1000, device="cuda", dtype=torch.float16)
w = torch.randn(1000, 1000, device="cuda", dtype=torch.float16) / 1000**0.5
bias = torch.randn(1000, device="cuda", dtype=torch.float16)
if step == "bias":
    y = matmul.linear(x, w, bias)
    ref = x.float() @ w.float().T + bias.float()
elif step == "kn":
    y = matmul.matmul(x, w)  # w read as b [K, N]
    ref = x.float() @ w.float()
elif step == "op":
    y = torch.ops.tilus_matmul.linear(x, w, bias, "")
    ref = x.float() @ w.float().T + bias.float()
elif step in ("backward", "backward_here"):  # dX = dY @ W through the operator, by autograd's thread or this one
    w.requires_grad_()
    grad = torch.randn(m, 1000, device="cuda", dtype=torch.float16)
    if step == "backward":
        y = torch.ops.tilus_matmul.linear(x, w, bias, "")
        y.backward(grad)
        y = w.grad
    else:
        y = torch.ops.tilus_matmul.mm(grad, w.detach())
    ref = grad.float().T @ x.float() if step == "backward" else grad.float() @ w.detach().float()
torch.cuda.synchronize()
print(f"{version} {step} M={m}: relative error {float((y.float() - ref).norm() / ref.norm()):.2e}")
"""

for version in sys.argv[1:] or ("v5", "v3"):
    for step in ("bias", "op", "kn", "backward_here", "backward"):
        for m in (100,):
            done = subprocess.run([sys.executable, "-c", STEP, version, step, str(m)], capture_output=True, text=True)
            last = (done.stdout.strip().splitlines() or [""])[-1]
            error = [line for line in done.stderr.splitlines() if "Error" in line][-1:] if done.returncode else []
            print(f"{version} {step} M={m}: exit {done.returncode} {last} {' '.join(error)}", flush=True)
