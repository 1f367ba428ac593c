//! Name → function. (Filled in by the functions modules.)

use std::collections::BTreeMap;

use super::{Function, FunctionError};

pub fn build(name: &str, _params: &BTreeMap<String, String>) -> Result<Box<dyn Function>, FunctionError> {
    Err(FunctionError::Unknown(name.to_string()))
}
