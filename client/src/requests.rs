//! The HTTP request of each send step of an entry (SPEC section 6), built
//! from the shared wire shapes ([`spark_core::wire`]).

use bytes::Bytes;
use spark_core::ids::Id;
use spark_core::wire::bodies::{CreateMomentBody, StartTurnBody, TurnStarted};
use spark_core::wire::{
    HEADER_CONTENT_SHA256, HEADER_MEDIA_ROLE, HEADER_MOMENT_ID, HEADER_PHOTO, TURN_MODE_PRACTICAL,
};

use crate::client::Client;
use crate::outbox::{Entry, MediaFile, Step};
use crate::transport::{HttpRequest, HttpResponse, Method};
use crate::ClientError;

impl Client {
    /// The request for one step of an entry.
    pub fn step_request(&self, entry: &Entry, step: Step) -> Result<HttpRequest, ClientError> {
        Ok(match step {
            Step::CreateMoment => json_request(
                Method::Post,
                "/api/moments".to_owned(),
                &CreateMomentBody {
                    id: Some(entry.moment_id.to_string()),
                    client_request_id: Some(entry.id.clone()),
                    text: entry.text.clone(),
                    caption: entry.caption.clone(),
                    lang: entry.lang.clone(),
                    captured_at: Some(entry.captured_at.clone()),
                },
            )?,
            Step::UploadCopy
            | Step::UploadOriginal
            | Step::UploadCopyOf(_)
            | Step::UploadOriginalOf(_) => {
                let (media_id, photo, role, file) = entry.upload(step).ok_or_else(|| {
                    ClientError::Invalid(format!("entry {} has no step {step}", entry.id))
                })?;
                self.media_request(entry, media_id, photo, role, file)?
            }
            Step::StartTurn => json_request(
                Method::Post,
                format!("/api/moments/{}/turns", entry.moment_id),
                &StartTurnBody {
                    client_request_id: Some(entry.turn_request_id.clone()),
                    mode: Some(TURN_MODE_PRACTICAL.to_owned()),
                    seat: None,
                },
            )?,
        })
    }

    /// `PUT /api/media/{media_id}` of one of the entry's files; photo 0
    /// (the only photo before issue 27) is sent without `X-Photo`, as
    /// every earlier build sent it.
    fn media_request(
        &self,
        entry: &Entry,
        media_id: Id,
        photo: u8,
        role: &str,
        media: &MediaFile,
    ) -> Result<HttpRequest, ClientError> {
        let path = self.outbox.media_path(entry, media);
        let bytes = std::fs::read(&path).map_err(|e| crate::fsio::io_error(&path, e))?;
        let mut headers = vec![
            (HEADER_MOMENT_ID.into(), entry.moment_id.to_string()),
            (HEADER_MEDIA_ROLE.into(), role.into()),
            ("content-type".into(), media.content_type.clone()),
            (HEADER_CONTENT_SHA256.into(), media.sha256.clone()),
        ];
        if photo > 0 {
            headers.push((HEADER_PHOTO.into(), photo.to_string()));
        }
        Ok(HttpRequest {
            method: Method::Put,
            path: format!("/api/media/{media_id}"),
            headers,
            body: Bytes::from(bytes),
        })
    }
}

/// A request with `body` as its JSON body. The body goes through a JSON
/// value, so its members are sent in `serde_json`'s map order (by name), as
/// this client always sent them.
pub(crate) fn json_request(
    method: Method,
    path: String,
    body: &impl serde::Serialize,
) -> Result<HttpRequest, ClientError> {
    let value = serde_json::to_value(body).map_err(|e| ClientError::Invalid(e.to_string()))?;
    Ok(HttpRequest::json(method, path, &value))
}

/// The turn id in a `POST /api/moments/{id}/turns` answer
/// ([`TurnStarted`]), when it has one.
pub(crate) fn started_turn_id(response: &HttpResponse) -> Option<String> {
    let answer: TurnStarted<serde_json::Value> = serde_json::from_slice(&response.body).ok()?;
    answer.turn.get("id")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::outbox::{Capture, MediaBytes, Outbox};
    use crate::transport::{Transport, TransportError};

    /// The bodies the client sends are byte for byte what it sent before
    /// they came from the shared wire types: members by name, `null` for
    /// what is missing, no `seat`; the media headers by their shared names.
    #[test]
    fn step_bodies_keep_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::at(1_767_225_600_000));
        let outbox = Outbox::open(dir.path()).unwrap();
        let media = |bytes: &[u8], content_type: &str| MediaBytes {
            bytes: bytes.to_vec(),
            content_type: content_type.into(),
        };
        let entry = outbox
            .capture(
                clock.as_ref(),
                Capture {
                    copy: media(b"copy", "image/jpeg"),
                    original: media(b"original", "image/png"),
                    more_photos: vec![crate::outbox::PhotoBytes {
                        copy: media(b"copy 1", "image/jpeg"),
                        original: media(b"original 1", "image/jpeg"),
                    }],
                    text: Some("Ausfahrt freihalten".into()),
                    caption: None,
                    lang: Some("de".into()),
                    captured_at_ms: None,
                },
            )
            .unwrap();
        struct NoTransport;
        impl Transport for NoTransport {
            fn send(
                &self,
                _: HttpRequest,
            ) -> futures_util::future::BoxFuture<'_, Result<HttpResponse, TransportError>>
            {
                Box::pin(async { Err(TransportError::Network("none".into())) })
            }
        }
        let client = Client::new(outbox, Arc::new(NoTransport), clock);
        let create = client.step_request(&entry, Step::CreateMoment).unwrap();
        assert_eq!(
            String::from_utf8(create.body.to_vec()).unwrap(),
            format!(
                r#"{{"caption":null,"captured_at":"2026-01-01T00:00:00Z","client_request_id":"{}","id":"{}","lang":"de","text":"Ausfahrt freihalten"}}"#,
                entry.id, entry.moment_id
            )
        );
        let turn = client.step_request(&entry, Step::StartTurn).unwrap();
        assert_eq!(
            String::from_utf8(turn.body.to_vec()).unwrap(),
            format!(
                r#"{{"client_request_id":"{}","mode":"practical"}}"#,
                entry.turn_request_id
            )
        );
        let message = json_request(
            Method::Post,
            "/api/messages".to_owned(),
            &spark_core::wire::bodies::PostMessageBody {
                id: "01M8MZB987NAS3D1V2NT51K0E1".into(),
                thread_id: entry.moment_id.to_string(),
                body: "Bin gleich da".into(),
            },
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(message.body.to_vec()).unwrap(),
            format!(
                r#"{{"body":"Bin gleich da","id":"01M8MZB987NAS3D1V2NT51K0E1","thread_id":"{}"}}"#,
                entry.moment_id
            )
        );
        let copy = client.step_request(&entry, Step::UploadCopy).unwrap();
        assert_eq!(copy.header("X-Media-Role"), Some("copy"));
        assert_eq!(
            copy.header("X-Moment-Id"),
            Some(&*entry.moment_id.to_string())
        );
        assert_eq!(copy.header("X-Content-SHA256"), Some(&*entry.copy.sha256));
        // Photo 0 goes without X-Photo, as before several photos; photo 1
        // with it, under its own media id.
        assert_eq!(copy.header("X-Photo"), None);
        let second = client
            .step_request(&entry, Step::UploadOriginalOf(1))
            .unwrap();
        assert_eq!(second.header("X-Photo"), Some("1"));
        assert_eq!(second.header("X-Media-Role"), Some("original"));
        assert_eq!(
            second.path,
            format!("/api/media/{}", entry.more_photos[0].original_id)
        );
        assert_eq!(&second.body[..], b"original 1");
        assert!(client.step_request(&entry, Step::UploadCopyOf(2)).is_err());
    }
}
