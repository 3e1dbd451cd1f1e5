//! The locks that let concurrent spawns build a diff snapshot's head once
//! (crate::catalog::head). Apart from it so that the manager, which owns
//! them, does not import the code that uses the manager.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A lock per diff snapshot whose head is being made ready.
#[derive(Default)]
pub struct Builders(pub Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);
