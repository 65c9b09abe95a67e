"""The cost model: what one engine step costs, from its shape (``step_shape``) — analytic
(``roofline`` over ``kernel_costs`` and ``layer_ops``) or from measured tables (``calibrated``
over a ``profile``), chosen by ``base.make_cost_model``."""
