//! Name → function. Adding a function = one module with a `build(params)` + one line in
//! [`FUNCTIONS`].

use std::collections::BTreeMap;

use super::{normalize, record_counter, statistics, Function, FunctionError};

/// Builds a function from its parameters (rejecting the ones it does not know).
pub type Builder = fn(&BTreeMap<String, String>) -> Result<Box<dyn Function>, FunctionError>;

/// Every function, by registry name.
pub const FUNCTIONS: &[(&str, Builder)] = &[
    (record_counter::NAME, record_counter::build),
    (statistics::NAME, statistics::build),
    (normalize::NAME, normalize::build),
];

/// The registry names, in [`FUNCTIONS`] order.
pub const NAMES: [&str; FUNCTIONS.len()] = {
    let mut names = [""; FUNCTIONS.len()];
    let mut i = 0;
    while i < FUNCTIONS.len() {
        names[i] = FUNCTIONS[i].0;
        i += 1;
    }
    names
};

/// The function registered as `name`, built with `params`.
pub fn build(name: &str, params: &BTreeMap<String, String>) -> Result<Box<dyn Function>, FunctionError> {
    match FUNCTIONS.iter().find(|(n, _)| *n == name) {
        Some((_, build)) => build(params),
        None => Err(FunctionError::Unknown(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_builds_every_listed_function_under_its_own_name() {
        assert_eq!(NAMES, ["record_counter", "statistics", "normalize"]);
        for name in NAMES {
            let f = build(name, &BTreeMap::new()).expect("builds");
            assert_eq!(f.name(), name);
        }
    }

    #[test]
    fn registry_rejects_unknown_names_and_lists_the_known_ones() {
        let err = build("median", &BTreeMap::new()).err().expect("unknown");
        assert_eq!(err, FunctionError::Unknown("median".into()));
        assert!(err.to_string().contains(&NAMES.join(", ")), "{err}");
    }

    #[test]
    fn registry_rejects_unknown_params() {
        let params = BTreeMap::from([("window".to_string(), "5".to_string())]);
        for name in NAMES {
            let err = build(name, &params).err().expect("bad param");
            assert_eq!(
                err,
                FunctionError::BadParam {
                    function: name.into(),
                    param: "window".into(),
                    message: format!("{name} takes no parameters"),
                }
            );
        }
    }
}
