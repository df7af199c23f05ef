"""Pruning to a latency budget measured on the target device: a package of libraries.

Where things are (each module imports only those above it; none imports a stage):

* :mod:`pipeline.prune.channels` (beside this package): channel groups, widths, importance, pruning to a plan;
* :mod:`pipeline.latency.model`: :class:`~pipeline.latency.model.Measurement`, the table of measured
  changes and the per-layer model fitted to it (``LayerModel``, ``LatencyTable``, ``build_table``), the
  cost of building a table (``table_cost``);
* :mod:`pipeline.latency.search`: the knapsack plan (``solve_plan``), its repair, the nested path and the
  bisection on it; generic over the cost (latency or MACs: ``MacsCost``);
* :mod:`pipeline.latency.measure`: the meter (interleaved windows, an atomically written cache), the job
  spec, the agent the budget names;
* :mod:`pipeline.latency.budget`: the budget search by measurement, the table's out-of-sample check and
  the prune stage's latency path, loaded by name so that a MACs target's code hash leaves it out;
* plots: :mod:`pipeline.tasks.classification.latency_plots`, drawn by the report from the prune stage's recorded metrics.

**What is measured.** For every prunable channel group of the model (Torch-Pruning's dependency groups:
a convolution's output channels together with everything coupled to them — its BatchNorm, the next
layers' inputs, every other layer on the same residual stream) the latency of the network with that
group at a few candidate widths (multiples of ``round_to``), all other groups held at a *context* plan.
Every measurement is an ordinary benchmark job of the deploy stage's runtime and precision for that
device, sent through :class:`device.client.AgentClient`, repeated over several interleaved windows; the
median window is used and the spread is kept.

**Why whole networks, not cut-out layers.** The sub-network measured for a group is the whole network in
its context, changed in that group only, and the table holds the *change* of latency against the context:

* the agent takes image-shaped models only (1 or 3 input channels: its smoke inference runs a real
  photograph through them), so a cut-out layer needs an adapter layer in front that costs time itself;
* the runtime fuses across layer boundaries (Conv+BN+ReLU+Add in ONNX Runtime, whole blocks in TensorRT)
  and each call has a fixed overhead of the order of a small layer's time: an isolated 1×1 or depthwise
  layer — exactly the memory-bound layers MACs misjudge — is timed with costs it does not have in the
  network, and a sum of isolated layers counts the call overhead once per layer;
* a change measured in context has neither problem; its price is that it is a small difference of two
  large times, so it is measured over several windows and smoothed (monotone in the width).

**From the table to a prediction.** A sum of the single-group changes counts every layer between two
groups twice (its time shrinks with the product of both widths): on ResNet-18 it predicted negative
times for deep cuts. The table's measurements are therefore fitted by a per-layer model
(:class:`LayerModel`: a fixed time, a time per MAC for each layer — bilinear in the widths of the two
groups it joins — and a time per activation), the knapsack's costs are made separable by holding the
other groups at the last plan (HALP's way), and the knapsack's plan is measured; when it misses, the
budget is bisected by measurement along a nested path of plans through it (:func:`pipeline.latency.budget.plan_to_budget`).
The model is checked against measured full runs of the unpruned and of a MACs-pruned network
(:func:`pipeline.latency.budget.check_table`), and on plans it was not fitted to; the errors are recorded in the run.
"""
