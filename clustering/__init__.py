"""Clustering: mark compilable TF ops, form cycle-free clusters, lower each to HLO.

Data flow: `mark(graph)` → `form_clusters(graph, decisions)` → `lower_cluster(graph,
cluster)` per cluster. The TF op registry (`registry.OP_RULES`) holds one
compilability rule and one HLO lowering per TF op type.
"""

from __future__ import annotations

# The rule modules register into OP_RULES on import; importing any module of this package
# runs this file first, so every rule is registered before a rule is looked up.
from tfxla_lite.clustering import (  # noqa: F401
    rules_batch_norm,
    rules_control_flow,
    rules_conv,
    rules_conv_grad,
    rules_elementwise,
    rules_gradients,
    rules_indexing,
    rules_linalg,
    rules_nn,
    rules_pool,
    rules_random,
    rules_resize,
    rules_slicing,
    rules_space,
    rules_tensor,
    rules_variables,
)
from tfxla_lite.clustering.cluster import (
    TRIVIAL_OPS,
    Cluster,
    ClusteringResult,
    cluster_graph,
    counted_size,
    form_clusters,
)
from tfxla_lite.clustering.lower import lower_cluster
from tfxla_lite.clustering.mark import (
    PLUMBING_OPS,
    Decision,
    MarkOptions,
    mark,
    why_not_compilable,
)
from tfxla_lite.clustering.registry import OP_RULES, LoweringError, OpRule, source_location

__all__ = [
    "OP_RULES",
    "PLUMBING_OPS",
    "TRIVIAL_OPS",
    "Cluster",
    "ClusteringResult",
    "Decision",
    "LoweringError",
    "MarkOptions",
    "OpRule",
    "cluster_graph",
    "counted_size",
    "form_clusters",
    "lower_cluster",
    "mark",
    "source_location",
    "why_not_compilable",
]
