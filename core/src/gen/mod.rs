//! Generation machine.
