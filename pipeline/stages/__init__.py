"""The stages written once for every task: each takes the hooks its task supplies when the task declares it
(``pipeline/tasks/<task>/__init__.py``), and never imports a task."""
