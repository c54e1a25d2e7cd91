from kernels.attention.base import AttentionBackend, AttnMeta, available_backends, create_backend

__all__ = ["AttentionBackend", "AttnMeta", "available_backends", "create_backend"]
