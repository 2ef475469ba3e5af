"""TensorFlow glue for elastictrain: a tf.data source over exactly-once shards, Keras state for
the checkpointer, and a Keras callback that saves every N steps and on preemption and restores
when ``fit`` starts."""

from .checkpoint import ElasticKerasCallback, KerasState, TFCheckpointer
from .data import ElasticTFData
from .fit import elastic_fit, elastic_strategy
from .profiling import comm_profile_from_gradients

__all__ = ["ElasticTFData", "KerasState", "TFCheckpointer", "ElasticKerasCallback", "elastic_fit", "elastic_strategy",
           "comm_profile_from_gradients"]
