"""roundpipe-migrate: the libcst codemod that rewrites torch.amp / apex scripts into the
RoundPipe form. Its rules land with the migration issue; see docs/ and design/MIGRATE.md.
"""
