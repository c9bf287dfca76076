"""The Triton kernel runs on CPU only through its interpreter, which must be on before ``@triton.jit``."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
