"""The TF op types of loops, branches and TensorLists, by name.

Marking and cluster formation name them without the lowering rules
(`rules_control_flow.py`), which mark and lower the functions these ops call: kept
apart so that mark.py and cluster.py need not import the rules that import them.
"""

from __future__ import annotations

WHILE_OPS = ("While", "StatelessWhile")
IF_OPS = ("If", "StatelessIf")
CASE_OPS = ("Case", "StatelessCase")
# Op types whose inputs or outputs may be TensorLists here.
LIST_OPS = frozenset({
    "TensorListReserve", "EmptyTensorList", "TensorListFromTensor", "TensorListSetItem",
    "TensorListGetItem", "TensorListPushBack", "TensorListPopBack", "TensorListStack",
    "TensorListElementShape", "TensorListLength",
})
FUNCTIONAL_OPS = frozenset(WHILE_OPS + IF_OPS + CASE_OPS)
# Ops that may take a resource handle here (and, though TF calls them stateful, have
# none of their own): loops and branches (`_check_variables`), VariableShape.
HANDLE_OPS = FUNCTIONAL_OPS | {"VariableShape"}
VARIANT_OPS = LIST_OPS | FUNCTIONAL_OPS | {"Identity", "ZerosLike", "AddN"}
