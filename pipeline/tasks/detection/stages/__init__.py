"""The detection task's stages, one module each (listed in :data:`pipeline.tasks.detection.TASK`)."""
