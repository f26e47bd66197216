"""Flash attention (causal, GQA, per-row lengths) for training and prefill: kernels, custom_vjp, reference."""
