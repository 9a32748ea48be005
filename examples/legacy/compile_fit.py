"""TF 2.1-2.3 style: compile/fit under set_policy('mixed_float16').

Unmodified legacy code (the TF 2.2 mixed precision guide's pattern). Run it
on current TensorFlow with `python -m tf_lso run examples/legacy/compile_fit.py`.
"""

import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow.keras import layers
from tensorflow.keras.mixed_precision import experimental as mixed_precision

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

policy = mixed_precision.Policy('mixed_float16')
mixed_precision.set_policy(policy)
print('Compute dtype: %s' % policy.compute_dtype)
print('Variable dtype: %s' % policy.variable_dtype)
print('Loss scale: %s' % policy.loss_scale)

inputs = tf.keras.Input(shape=(64,), name='digits')
x = layers.Dense(128, activation='relu', name='dense_1')(inputs)
x = layers.Dense(128, activation='relu', name='dense_2')(x)
x = layers.Dense(10, name='dense_logits')(x)
outputs = layers.Activation('softmax', dtype='float32', name='predictions')(x)
model = tf.keras.Model(inputs=inputs, outputs=outputs)

x_train = np.random.normal(size=(1024, 64)).astype('float32')
y_train = np.argmax(x_train[:, :10], axis=1)

model.compile(loss='sparse_categorical_crossentropy',
              optimizer=tf.keras.optimizers.RMSprop(learning_rate=1e-3),
              metrics=['accuracy'])
history = model.fit(x_train, y_train, batch_size=64, epochs=EPOCHS,
                    shuffle=False, verbose=0)

print('Optimizer: %s' % type(model.optimizer).__name__)
print('result loss_scale', float(model.optimizer.loss_scale()))
print('result loss', [round(v, 5) for v in history.history['loss']])
print('result weights', [float(np.sum(w)) for w in model.get_weights()])
