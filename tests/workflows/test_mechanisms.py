"""`jaxpos mechanisms`: every registered mechanism gets a row, and its order column tells a mechanism that acts
from the bag of words."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos import cli
from jaxpos.positions import MECHANISMS
from jaxpos.workflows.mechanisms import order_sensitivity, shuffled_positions


def test_order_sensitivity_is_zero_for_outputs_that_move_with_their_tokens():
    order = shuffled_positions(16)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 8))
    assert order_sensitivity(jnp.tanh(x), jnp.tanh(x[:, order]), order) == 0  # a position-wise map
    positions = jnp.arange(16.0)[None, :, None]
    assert order_sensitivity(x + positions, x[:, order] + positions, order) > 0.1
    distances = np.abs(np.subtract.outer(np.asarray(order), np.asarray(order)))
    assert not np.array_equal(distances, np.abs(np.subtract.outer(np.arange(16), np.arange(16))))  # not a reversal


def test_the_order_column_shows_each_mechanism_acting(capsys):
    cli.main(["mechanisms", "--seq-len", "16"])
    header, *lines = capsys.readouterr().out.strip().splitlines()
    column = header.split().index("order") - 1  # "grad norm" is two words
    rows = [line.split() for line in lines if line.split()[0] in MECHANISMS]
    order = {row[0]: float(row[column].rstrip("*")) for row in rows}
    marked = {row[0] for row in rows if row[column].endswith("*")}
    assert list(order) == list(MECHANISMS)
    assert order.pop("none") < 1e-6  # float error: a bag of words moves its outputs with its tokens
    # CoPE's e starts at zero, as its authors' code: at initialisation it is blind to order, and the table says so.
    assert marked == {"cope"} and lines[-1].startswith("* cope: its positional parameters start at zero")
    assert order.pop("cope") < 1e-6
    # The smallest of the others at initialisation (DIET-Abs, 1.3e-5) is 80 times the bag of words' float error.
    assert {kind: value for kind, value in order.items() if value < 5e-6} == {}
