"""``edgefold ship``: the folder an application runs, with the numbers the rung was chosen on.

A finished run knows everything an application needs to run one of its rungs as it was measured: the ONNX, the
preprocessing, the labels, the post-processing, the engine the device built and the build that made it. Shipping
writes them into one folder (:func:`pipeline.ship.bundle.ship`) with three ways to run it — a DeepStream ``nvinfer``
config, a Triton model repository, a standalone ``infer.py`` — and a card that says what the rung was chosen on and
under which conditions those figures hold.

What differs between tasks (the accuracy figure, labels and post-processing, ``nvinfer``'s network type) is the
task's :class:`pipeline.ship.task.ShipTask`; the rest is written once here.
"""
