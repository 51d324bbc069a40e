"""roundpipe-migrate: the libcst codemod that rewrites torch.amp GradScaler and NVIDIA apex
amp training scripts into the RoundPipe form (docs/migrate.md). Pure source manipulation:
it never imports torch, roundpipe or compat_matrix.
"""
