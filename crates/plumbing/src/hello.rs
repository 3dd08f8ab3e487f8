//! The hello every front channel starts with, both sides of it, written once.
//!
//! A front [`say`]s hello with its role ([`proto::front::Role`]) and reads the answer; the
//! monitor side [`check`]s the hello (the protocol revision, and the role when the channel
//! is meant for one) and answers with [`welcome`] or a refusal. [`answer`] is the monitor
//! side on a blocking channel (`zygo mcp`'s socketpair with its front); the supervisor,
//! which reads frames as they come, calls [`check`] and [`welcome`] itself.

use std::io::{Read, Write};

use proto::api::FrontFlags;
use proto::front::{Hello, HelloReply, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME};
use proto::{read_frame, write_frame, ProtoError};

/// Why a hello was not welcomed.
#[derive(Debug)]
pub enum HelloError {
    /// The monitor side answered with a refusal; its reason.
    Refused(String),
    /// The hello or its answer did not cross the channel.
    Proto(ProtoError),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::Refused(reason) => write!(f, "refused: {reason}"),
            HelloError::Proto(e) => write!(f, "{e}"),
        }
    }
}

/// The front's side: say hello as `role` (with `flags`, how the front was started; only
/// the API role sets any) and read the answer.
pub fn say<S: Read + Write>(chan: &mut S, role: Role, flags: FrontFlags) -> Result<(), HelloError> {
    write_frame(
        chan,
        &Hello {
            protocol: FRONT_PROTOCOL,
            role,
            flags,
        },
    )
    .map_err(HelloError::Proto)?;
    match read_frame::<_, HelloReply>(chan, MAX_FRONT_FRAME).map_err(HelloError::Proto)? {
        HelloReply::Welcome { .. } => Ok(()),
        HelloReply::Refused { reason } => Err(HelloError::Refused(reason)),
    }
}

/// The monitor side's verdict on a hello: the role it may act as from now on, or why it is
/// refused. `only`: the one role this channel is for, if it is for one.
pub fn check(hello: &Hello, only: Option<Role>) -> Result<Role, String> {
    if hello.protocol != FRONT_PROTOCOL {
        return Err(format!(
            "front protocol {} is not {FRONT_PROTOCOL}",
            hello.protocol
        ));
    }
    match only {
        Some(want) if hello.role != want => Err(format!(
            "this channel is for the {want:?} role, not {:?}",
            hello.role
        )),
        _ => Ok(hello.role),
    }
}

/// The answer to a hello that passed [`check`].
pub fn welcome() -> HelloReply {
    HelloReply::Welcome {
        version: env!("CARGO_PKG_VERSION").into(),
    }
}

/// The monitor side on a blocking channel: read the hello, [`check`] it, answer. The role
/// welcomed, or why not (the refusal has been sent when it could be).
pub fn answer<S: Read + Write>(chan: &mut S, only: Option<Role>) -> Result<Role, String> {
    let hello: Hello =
        read_frame(chan, MAX_FRONT_FRAME).map_err(|e| format!("the front's hello: {e}"))?;
    let verdict = check(&hello, only);
    let reply = match &verdict {
        Ok(_) => welcome(),
        Err(reason) => HelloReply::Refused {
            reason: reason.clone(),
        },
    };
    write_frame(chan, &reply).map_err(|e| format!("answer the front's hello: {e}"))?;
    verdict.map_err(|r| format!("refused the front: {r}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_front_is_welcomed_in_its_role() {
        let (mut front, mut monitor) = UnixStream::pair().expect("socketpair");
        let side = std::thread::spawn(move || answer(&mut monitor, Some(Role::Mcp)));
        say(&mut front, Role::Mcp, FrontFlags::default()).expect("welcomed");
        assert_eq!(side.join().expect("thread"), Ok(Role::Mcp));
    }

    #[test]
    fn another_role_or_revision_is_refused_with_a_reason() {
        let (mut front, mut monitor) = UnixStream::pair().expect("socketpair");
        let side = std::thread::spawn(move || answer(&mut monitor, Some(Role::Mcp)));
        match say(&mut front, Role::Cli, FrontFlags::default()) {
            Err(HelloError::Refused(r)) => assert!(r.contains("Mcp"), "{r}"),
            other => panic!("{other:?}"),
        }
        assert!(side.join().expect("thread").is_err());
        let old = Hello {
            protocol: FRONT_PROTOCOL + 1,
            role: Role::Cli,
            flags: FrontFlags::default(),
        };
        assert!(check(&old, None).is_err());
        assert_eq!(
            check(
                &Hello {
                    protocol: FRONT_PROTOCOL,
                    role: Role::Api,
                    flags: FrontFlags::default(),
                },
                None
            ),
            Ok(Role::Api)
        );
    }
}
