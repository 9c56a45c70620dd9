"""How much RSS a process gains from CUDA's libraries as it first uses them (no model): the share of an engine's
RSS after an unload that is not the model's. python bench/cuda_libraries_rss.py OUT.json (on a GPU)."""
import json
import sys

import psutil
import torch
import torch.nn.functional as F

GIB = 1024 ** 3
process = psutil.Process()
rss = lambda: round(process.memory_info().rss / GIB, 3)   # noqa: E731
import diffusers  # noqa: E402,F401  (as the engine process loads its libraries)
import transformers  # noqa: E402,F401

steps = {"libraries imported": rss()}
torch.zeros(1, device="cuda")
steps["CUDA context"] = rss()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
steps["cuBLAS (a bf16 matmul)"] = rss()
x = torch.randn(1, 96, 6, 64, 64, device="cuda")
F.conv3d(x, torch.randn(96, 96, 3, 3, 3, device="cuda"), padding=1).sum().item()
steps["cuDNN (a conv3d)"] = rss()
q = torch.randn(1, 12, 4096, 128, device="cuda", dtype=torch.bfloat16)
F.scaled_dot_product_attention(q, q, q).sum().item()
steps["attention (SDPA)"] = rss()
print(json.dumps(steps, indent=1))
open(sys.argv[1], "w").write(json.dumps(steps, indent=1))
