"""fp8 (e4m3) grouped matmul with per-channel scales for Hopper, plus an emulated MXFP8 reference."""
