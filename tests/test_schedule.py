import keras
import numpy as np
import pytest

import keras_transformer as kt


def paper_rate(step, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 4000, 100_000])
def test_schedule_equals_formula(step):
    schedule = kt.TransformerSchedule(512, warmup_steps=4000)
    np.testing.assert_allclose(float(schedule(step)), paper_rate(step), rtol=1e-6)


def test_schedule_peaks_at_warmup_and_round_trips():
    schedule = kt.TransformerSchedule(256, warmup_steps=100, scale=2.0)
    rates = [float(schedule(s)) for s in range(1, 400)]
    assert int(np.argmax(rates)) + 1 == 100
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config()
    assert float(restored(57)) == float(schedule(57))


def test_optimizer_has_paper_settings():
    optimizer = kt.make_optimizer(kt.TransformerSchedule(512))
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def test_callback_applies_and_logs_the_rate_each_step():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=kt.make_optimizer(0.0), loss="mse")
    schedule = kt.TransformerSchedule(64, warmup_steps=3)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((logs["learning_rate"], float(self.model.optimizer.learning_rate)))

    x = np.ones((5, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=1, epochs=1, verbose=0,
              callbacks=[kt.ScheduleCallback(schedule), Record()])
    expected = [paper_rate(step, 64, 3) for step in range(1, 6)]
    np.testing.assert_allclose([logged for logged, _ in seen], expected, rtol=1e-6)
    np.testing.assert_allclose([applied for _, applied in seen], expected, rtol=1e-6)
