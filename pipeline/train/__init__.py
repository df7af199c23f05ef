"""The training engine every task runs: one loop (resume, DDP, mixed precision, the fused step, progress), with the
task supplying only how a batch becomes a loss (:mod:`pipeline.train.engine`)."""
