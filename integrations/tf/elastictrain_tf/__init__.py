"""TensorFlow glue for elastictrain (tf.data over shards, Keras checkpoint callbacks).

Not built yet: this package only reserves the name so that the distribution's layout is
final. See the project's open issues for the checkpoint/resume work that brings it.
"""

__all__: list[str] = []
