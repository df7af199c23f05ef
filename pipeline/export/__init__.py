"""Export, written once for every task: what a task gives the export stage (:mod:`pipeline.export.hooks`)."""
