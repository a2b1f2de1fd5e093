//! Conditions as the core decides them: a type, a truth value, a reason and a message, before
//! the controllers stamp them with a time and a generation.

/// The truth value of a condition, as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truth {
    True,
    False,
    Unknown,
}

impl Truth {
    pub fn as_str(self) -> &'static str {
        match self {
            Truth::True => "True",
            Truth::False => "False",
            Truth::Unknown => "Unknown",
        }
    }

    pub fn from_bool(value: bool) -> Self {
        if value { Truth::True } else { Truth::False }
    }
}

/// A condition as decided by the core, before it is stamped with time and generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionSpec {
    pub type_: &'static str,
    pub status: Truth,
    /// CamelCase, machine-readable.
    pub reason: String,
    /// For people: what is wrong and what to do about it.
    pub message: String,
}

impl ConditionSpec {
    pub fn new(
        type_: &'static str,
        status: Truth,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}
