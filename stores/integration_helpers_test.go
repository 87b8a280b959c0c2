//go:build integration

package stores_test

import "github.com/minio/minio-go/v7"

func minioStat() minio.StatObjectOptions { return minio.StatObjectOptions{} }
