//! tokenwire-sim
