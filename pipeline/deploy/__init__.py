"""What every task's deploy stage does the same way on a device (:mod:`pipeline.deploy.session`)."""
