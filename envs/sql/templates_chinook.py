"""Question templates over Chinook (see :mod:`agentrl.envs.sql.questions`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from agentrl.envs.sql.template_kit import Question, lit, values
from agentrl.envs.sql.template_kit import make_question as _q


# --------------------------------------------------------------------------- chinook
def chinook_questions(con: sqlite3.Connection) -> Iterator[Question]:
    for country in values(con, "SELECT DISTINCT Country FROM Customer ORDER BY 1"):
        yield _q(
            "customers_in_country",
            1,
            f"How many customers live in {country}?",
            f"SELECT COUNT(*) FROM Customer WHERE Country = {lit(country)}",
        )
        yield _q(
            "invoice_total_country",
            1,
            f"What is the total amount of all invoices billed to {country}? Round to 2 decimal places.",
            f"SELECT ROUND(SUM(Total), 2) FROM Invoice WHERE BillingCountry = {lit(country)}",
        )
        yield _q(
            "customer_names_country",
            1,
            f"List the first and last names of the customers who live in {country}.",
            f"SELECT FirstName, LastName FROM Customer WHERE Country = {lit(country)}",
        )
    for year in values(con, "SELECT DISTINCT strftime('%Y', InvoiceDate) FROM Invoice ORDER BY 1"):
        yield _q(
            "invoices_in_year",
            1,
            f"How many invoices were issued in {year}?",
            f"SELECT COUNT(*) FROM Invoice WHERE strftime('%Y', InvoiceDate) = {lit(year)}",
        )
    for title in values(con, "SELECT DISTINCT Title FROM Employee ORDER BY 1"):
        yield _q(
            "employees_title",
            1,
            f"List the first and last names of the employees whose title is '{title}'.",
            f"SELECT FirstName, LastName FROM Employee WHERE Title = {lit(title)}",
        )
    for composer in values(
        con,
        "SELECT Composer FROM Track WHERE Composer IS NOT NULL GROUP BY Composer "
        "HAVING COUNT(*) BETWEEN 2 AND 12 ORDER BY Composer LIMIT 60",
    ):
        yield _q(
            "tracks_by_composer",
            1,
            f"List the names of the tracks whose composer is exactly '{composer}'.",
            f"SELECT Name FROM Track WHERE Composer = {lit(composer)}",
        )
    for genre in values(con, "SELECT Name FROM Genre ORDER BY 1"):
        yield _q(
            "tracks_in_genre",
            2,
            f"How many tracks belong to the genre '{genre}'?",
            f"SELECT COUNT(*) FROM Track t JOIN Genre g ON t.GenreId = g.GenreId WHERE g.Name = {lit(genre)}",
        )
        yield _q(
            "longest_in_genre",
            3,
            f"What is the name of the longest track (by milliseconds) in the genre '{genre}'?",
            "SELECT t.Name FROM Track t JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE g.Name = {lit(genre)} ORDER BY t.Milliseconds DESC LIMIT 1",
            ordered=True,
            limit=1,
            tie_sql="SELECT t.Milliseconds FROM Track t JOIN Genre g ON t.GenreId = g.GenreId "
            f"WHERE g.Name = {lit(genre)} ORDER BY t.Milliseconds DESC",
        )
    for artist in values(
        con,
        "SELECT ar.Name FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
        "GROUP BY ar.ArtistId HAVING COUNT(*) BETWEEN 2 AND 10 ORDER BY ar.Name",
    ):
        yield _q(
            "albums_by_artist",
            2,
            f"List the titles of the albums by the artist '{artist}'.",
            "SELECT al.Title FROM Album al JOIN Artist ar ON al.ArtistId = ar.ArtistId "
            f"WHERE ar.Name = {lit(artist)}",
        )
        yield _q(
            "tracks_by_artist",
            2,
            f"How many tracks are there on albums by '{artist}'?",
            "SELECT COUNT(*) FROM Track t JOIN Album al ON t.AlbumId = al.AlbumId "
            f"JOIN Artist ar ON al.ArtistId = ar.ArtistId WHERE ar.Name = {lit(artist)}",
        )
    for playlist in values(con, "SELECT Name FROM Playlist GROUP BY Name HAVING COUNT(*) = 1 ORDER BY 1"):
        yield _q(
            "playlist_size",
            2,
            f"How many tracks are on the playlist '{playlist}'?",
            "SELECT COUNT(*) FROM PlaylistTrack pt JOIN Playlist p ON pt.PlaylistId = p.PlaylistId "
            f"WHERE p.Name = {lit(playlist)}",
        )
    for first, last in con.execute("SELECT FirstName, LastName FROM Customer ORDER BY CustomerId").fetchall():
        yield _q(
            "customer_spent",
            2,
            f"What is the total amount spent by the customer {first} {last}? Round to 2 decimal places.",
            "SELECT ROUND(SUM(i.Total), 2) FROM Invoice i JOIN Customer c ON i.CustomerId = c.CustomerId "
            f"WHERE c.FirstName = {lit(first)} AND c.LastName = {lit(last)}",
        )
    yield _q(
        "tracks_per_mediatype",
        2,
        "For each media type, how many tracks use it? Return the media type name and the track count.",
        "SELECT m.Name, COUNT(*) FROM Track t JOIN MediaType m ON t.MediaTypeId = m.MediaTypeId GROUP BY m.MediaTypeId",
    )
    yield _q(
        "customers_per_country",
        2,
        "For each country, how many customers live there? Return the country and the count.",
        "SELECT Country, COUNT(*) FROM Customer GROUP BY Country",
    )
    for k in (3, 5):
        yield _q(
            "top_artists_tracks",
            3,
            f"Which {k} artists have the most tracks? List the artist names, the artist with the most tracks first.",
            "SELECT ar.Name FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId JOIN Track t "
            f"ON t.AlbumId = al.AlbumId GROUP BY ar.ArtistId ORDER BY COUNT(*) DESC LIMIT {k}",
            ordered=True,
            limit=k,
            tie_sql="SELECT COUNT(*) FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId JOIN Track t "
            "ON t.AlbumId = al.AlbumId GROUP BY ar.ArtistId ORDER BY COUNT(*) DESC",
        )
        yield _q(
            "top_countries_sales",
            3,
            f"Which {k} billing countries have the highest invoice totals? List them, the highest first.",
            f"SELECT BillingCountry FROM Invoice GROUP BY BillingCountry ORDER BY SUM(Total) DESC LIMIT {k}",
            ordered=True,
            limit=k,
            tie_sql="SELECT ROUND(SUM(Total), 2) FROM Invoice GROUP BY BillingCountry ORDER BY SUM(Total) DESC",
        )
    yield _q(
        "best_genre_sales",
        3,
        "Which genre has the highest sales, counted as the sum of unit price times quantity over all invoice lines?",
        "SELECT g.Name FROM InvoiceLine il JOIN Track t ON il.TrackId = t.TrackId JOIN Genre g ON "
        "t.GenreId = g.GenreId GROUP BY g.GenreId ORDER BY SUM(il.UnitPrice * il.Quantity) DESC LIMIT 1",
        ordered=True,
        limit=1,
        tie_sql="SELECT ROUND(SUM(il.UnitPrice * il.Quantity), 2) FROM InvoiceLine il JOIN Track t ON "
        "il.TrackId = t.TrackId GROUP BY t.GenreId ORDER BY 1 DESC",
    )
    yield _q(
        "rep_most_customers",
        3,
        "Which employee supports the most customers? Give the employee's first and last name.",
        "SELECT e.FirstName, e.LastName FROM Employee e JOIN Customer c ON c.SupportRepId = e.EmployeeId "
        "GROUP BY e.EmployeeId ORDER BY COUNT(*) DESC LIMIT 1",
        ordered=True,
        limit=1,
        tie_sql="SELECT COUNT(*) FROM Customer GROUP BY SupportRepId ORDER BY 1 DESC",
    )
    for country in values(
        con, "SELECT Country FROM Customer GROUP BY Country HAVING COUNT(*) > 1 ORDER BY 1"
    ):
        yield _q(
            "top_spender_country",
            3,
            f"Which customer from {country} has spent the most in total? Give the first and last name.",
            "SELECT c.FirstName, c.LastName FROM Customer c JOIN Invoice i ON i.CustomerId = c.CustomerId "
            f"WHERE c.Country = {lit(country)} GROUP BY c.CustomerId ORDER BY SUM(i.Total) DESC LIMIT 1",
            ordered=True,
            limit=1,
            tie_sql="SELECT ROUND(SUM(i.Total), 2) FROM Customer c JOIN Invoice i ON i.CustomerId = c.CustomerId "
            f"WHERE c.Country = {lit(country)} GROUP BY c.CustomerId ORDER BY 1 DESC",
        )
    for genre in values(con, "SELECT Name FROM Genre ORDER BY 1"):
        yield _q(
            "top_artist_genre",
            3,
            f"Which artist has the most tracks in the genre '{genre}'? Give the artist's name.",
            "SELECT ar.Name FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId JOIN Track t ON "
            "t.AlbumId = al.AlbumId JOIN Genre g ON g.GenreId = t.GenreId "
            f"WHERE g.Name = {lit(genre)} GROUP BY ar.ArtistId ORDER BY COUNT(*) DESC LIMIT 1",
            ordered=True,
            limit=1,
            tie_sql="SELECT COUNT(*) FROM Album al JOIN Track t ON t.AlbumId = al.AlbumId JOIN Genre g ON "
            f"g.GenreId = t.GenreId WHERE g.Name = {lit(genre)} GROUP BY al.ArtistId ORDER BY 1 DESC",
        )
    for n in (100, 200, 300):
        yield _q(
            "big_genres",
            3,
            f"List the names of the genres that have more than {n} tracks.",
            "SELECT g.Name FROM Genre g JOIN Track t ON t.GenreId = g.GenreId GROUP BY g.GenreId "
            f"HAVING COUNT(*) > {n}",
        )
    yield _q(
        "artists_without_albums",
        3,
        "How many artists have no albums?",
        "SELECT COUNT(*) FROM Artist WHERE ArtistId NOT IN (SELECT ArtistId FROM Album)",
    )
    for amount in (40, 45):
        yield _q(
            "big_spenders",
            3,
            f"List the first and last names of the customers who have spent more than {amount} in total.",
            "SELECT c.FirstName, c.LastName FROM Customer c JOIN Invoice i ON i.CustomerId = c.CustomerId "
            f"GROUP BY c.CustomerId HAVING SUM(i.Total) > {amount}",
        )
    for n in (20, 25, 30):
        yield _q(
            "long_albums",
            3,
            f"List the titles of the albums that have more than {n} tracks.",
            "SELECT al.Title FROM Album al JOIN Track t ON t.AlbumId = al.AlbumId GROUP BY al.AlbumId "
            f"HAVING COUNT(*) > {n}",
        )
    yield _q(
        "genres_above_avg_length",
        3,
        "List the names of the genres whose average track length is longer than the average length of all tracks.",
        "SELECT g.Name FROM Genre g JOIN Track t ON t.GenreId = g.GenreId GROUP BY g.GenreId "
        "HAVING AVG(t.Milliseconds) > (SELECT AVG(Milliseconds) FROM Track)",
    )
