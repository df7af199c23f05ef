"""What every task's pipeline stands on: the recipe, the run context and manifest, the stage base, the code hash
that keys a stage's cache, the log, and the :class:`~pipeline.core.task.Task` interface a task declares.

Nothing here imports a task or a stage: the runner and the CLI assemble them.
"""
