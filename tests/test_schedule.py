import keras
import numpy as np
import pytest

import keras_transformer as kt


def paper_rate(step, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 2, 4000, 100_000])
def test_schedule_equals_formula(step):
    """Keras calls a schedule with the optimizer's iteration count, 0 for the first update;
    the paper counts steps from 1 (§5.3): iteration i gets step i + 1's rate."""
    schedule = kt.TransformerSchedule(512, warmup_steps=4000)
    np.testing.assert_allclose(float(schedule(step - 1)), paper_rate(step), rtol=1e-6)


@pytest.mark.parametrize("accumulation", [None, 2])
def test_each_update_gets_its_own_step_inside_the_optimizer(accumulation):
    """The rate of update n (from 1) is the paper's rate at step n, recovered from plain SGD
    updates (w -= lr * g with g = 1), with and without gradient accumulation."""
    schedule = kt.TransformerSchedule(64, warmup_steps=3)
    variable = keras.Variable(0.0)
    optimizer = keras.optimizers.SGD(schedule, gradient_accumulation_steps=accumulation)
    fused = kt.make_optimizer(schedule, gradient_accumulation_steps=accumulation)
    rates = []
    for _ in range(5 * (accumulation or 1)):
        before = float(variable.numpy())
        optimizer.apply([keras.ops.ones(())], [variable])
        if float(variable.numpy()) != before:
            rates.append(before - float(variable.numpy()))
    expected = [paper_rate(step, 64, 3) for step in range(1, 6)]
    if accumulation is None:  # Keras hands a schedule micro-batches under accumulation
        np.testing.assert_allclose(rates, expected, rtol=1e-5)
    fused.build([variable])
    seen = []
    for _ in range(5 * (accumulation or 1)):
        seen.append(float(fused.learning_rate))
        fused.iterations  # noqa: B018 (read: the update count)
        fused._iterations.assign_add(1)
    per_update = seen[(accumulation or 1) - 1::accumulation or 1]
    np.testing.assert_allclose(per_update, expected, rtol=1e-6)


def test_schedule_peaks_at_warmup_and_round_trips():
    schedule = kt.TransformerSchedule(256, warmup_steps=100, scale=2.0)
    rates = [float(schedule(i)) for i in range(400)]  # iteration i is step i + 1
    assert int(np.argmax(rates)) + 1 == 100
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config()
    assert float(restored(57)) == float(schedule(57))


def test_optimizer_has_paper_settings():
    optimizer = kt.make_optimizer(kt.TransformerSchedule(512))
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def test_callback_applies_and_logs_the_rate_each_step():
    """Compiled with a plain rate, the callback hands the optimizer the schedule; the logged
    rate (counted on the host) is the rate each update used (read from the optimizer)."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=kt.make_optimizer(0.0), loss="mse")
    schedule = kt.TransformerSchedule(64, warmup_steps=3)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.applied = float(self.model.optimizer.learning_rate)

        def on_train_batch_end(self, batch, logs=None):
            seen.append((logs["learning_rate"], self.applied))

    x = np.ones((5, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=1, epochs=1, verbose=0,
              callbacks=[kt.ScheduleCallback(schedule), Record()])
    expected = [paper_rate(step, 64, 3) for step in range(1, 6)]
    np.testing.assert_allclose([logged for logged, _ in seen], expected, rtol=1e-6)
    np.testing.assert_allclose([applied for _, applied in seen], expected, rtol=1e-6)
