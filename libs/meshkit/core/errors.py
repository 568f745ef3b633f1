"""Errors a servicer raises; the server interceptor turns them into gRPC statuses."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """A failure with a gRPC status code and a message meant for the caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid_argument(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, message)


def resource_exhausted(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def failed_precondition(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAVAILABLE, message)


def deadline_exceeded(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def unauthenticated(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, message)


def permission_denied(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.PERMISSION_DENIED, message)
