"""Triton kernels (attention: store_kv, prefill_attention, decode_attention). Importing a kernel module
imports triton; nothing here does, so `import lamina` works without it."""
