"""Shared RL math and base modules: loss primitives, the critic-free objective, values and GAE, credit
assignment over prefix trees and segments, and the base LightningModules every algorithm subclasses."""
