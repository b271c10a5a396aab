//! `eval` in the warm interpreter through the real agent binary.

mod common;

use common::TestAgent;
use forkvm_proto::{ClientError, ErrorKind, EvalOutcome};

fn value(agent: &TestAgent, code: &str) -> Option<String> {
    match agent.client().eval(code).unwrap().outcome {
        EvalOutcome::Value { value_repr } => value_repr,
        EvalOutcome::Exception { traceback, .. } => panic!("{code:?} raised:\n{traceback}"),
    }
}

#[test]
fn expressions_statements_and_persistent_state() {
    let agent = TestAgent::start();
    assert_eq!(value(&agent, "1+1").as_deref(), Some("2"));
    assert_eq!(value(&agent, "x = 41"), None);
    assert_eq!(value(&agent, "x + 1").as_deref(), Some("42"));
    assert_eq!(value(&agent, "y = x * 2\ny").as_deref(), Some("82"));
    assert_eq!(value(&agent, "'a' * 3").as_deref(), Some("'aaa'"));
}

#[test]
fn prints_are_captured_not_mixed_into_the_channel() {
    let agent = TestAgent::start();
    let r = agent.client().eval("import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n7").unwrap();
    assert_eq!(r.outcome, EvalOutcome::Value { value_repr: Some("7".into()) });
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("hello\n", "warn\n"));
}

#[test]
fn exceptions_return_tracebacks_and_the_interpreter_survives() {
    let agent = TestAgent::start();
    let r = agent.client().eval("def f():\n    raise ValueError('boom')\nf()").unwrap();
    match r.outcome {
        EvalOutcome::Exception { exception, traceback } => {
            assert_eq!(exception, "ValueError: boom");
            assert!(traceback.contains("in f") && traceback.contains("ValueError: boom"), "{traceback}");
        }
        other => panic!("expected an exception, got {other:?}"),
    }
    let r = agent.client().eval("raise SystemExit(3)").unwrap();
    assert!(matches!(r.outcome, EvalOutcome::Exception { ref exception, .. } if exception.contains("SystemExit")));
    let r = agent.client().eval("1 +").unwrap();
    assert!(matches!(r.outcome, EvalOutcome::Exception { ref exception, .. } if exception.contains("SyntaxError")));
    assert_eq!(value(&agent, "2 * 21").as_deref(), Some("42"));
}

#[test]
fn a_dead_interpreter_is_reported_then_restarted() {
    let agent = TestAgent::start();
    assert_eq!(value(&agent, "z = 1"), None);
    let err = agent.client().eval("import os; os._exit(1)").unwrap_err();
    assert!(matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::Interpreter), "{err}");
    assert_eq!(value(&agent, "'z' in globals()").as_deref(), Some("False"));
}

#[test]
fn numpy_in_the_warm_interpreter() {
    let agent = TestAgent::start();
    let got = value(&agent, "import numpy; numpy.arange(3).sum()").unwrap();
    assert!(got == "np.int64(3)" || got == "3", "{got}");
}

#[test]
fn eval_without_interpreter_is_unsupported() {
    let agent = TestAgent::start_with(&[]);
    let err = agent.client().eval("1").unwrap_err();
    assert!(matches!(err, ClientError::Agent(ref e) if e.kind == ErrorKind::Unsupported), "{err}");
    assert!(!agent.client().ping().unwrap().eval_available);
}
