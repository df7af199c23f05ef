"""The classification task's stages, one module each (listed in :data:`pipeline.tasks.classification.TASK`)."""
